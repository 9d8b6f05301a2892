/*
 * What the backend's two kinds of model share: a generator's (`switchboard_backend.c`) and a pooling
 * model's (`pooling.c`). Both hand Triton's requests to a process of the worker over a Unix socket
 * whose path is in a file of the model's folder; the file's name says the model's kind.
 */

#ifndef SWITCHBOARD_BACKEND_H
#define SWITCHBOARD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "triton_api.h"

#define HIDDEN __attribute__((visibility("hidden")))

/* The first member of every model's state, so that the entry points know which kind they hold. */
enum { KIND_GENERATOR = 1, KIND_POOLING = 2 };

/* The file in a pooling model's folder that names its model process's socket. */
#define POOLING_SOCKET_FILE "batch_socket"

HIDDEN uint64_t now_ns(void);
HIDDEN uint64_t wall_clock_ns(void);
HIDDEN void forget(TRITONSERVER_Error* error);
HIDDEN void put_le(uint8_t* at, uint64_t value, int size);
HIDDEN uint64_t get_le(const uint8_t* at, int size);
HIDDEN bool read_exactly(int connection, uint8_t* into, size_t size);
HIDDEN bool send_all(int connection, struct iovec* parts, int count);
/* The socket's path, read from the file `file` of the model's folder. */
HIDDEN TRITONSERVER_Error* socket_path(TRITONBACKEND_Model* triton_model, const char* file, char* path, size_t size);
/* Connect to the socket at `path`, waiting up to `wait_s` for its process to listen. */
HIDDEN TRITONSERVER_Error* connect_to(const char* path, double wait_s, int* connection);

/* A pooling model (`pooling.c`): its state, its instances' states, and one batch of requests. */
HIDDEN TRITONSERVER_Error* pooling_model_new(TRITONBACKEND_Model* triton_model, void** state);
HIDDEN void pooling_model_delete(void* state);
HIDDEN TRITONSERVER_Error* pooling_instance_new(void** state);
HIDDEN void pooling_instance_delete(void* state);
HIDDEN void pooling_execute(
    void* model_state, void* instance_state, TRITONBACKEND_ModelInstance* instance,
    TRITONBACKEND_Request** requests, uint32_t request_count);

#endif
