/*
 * Triton backend "switchboard": a generator model whose requests go straight from Triton to the
 * worker's engine loop over a Unix socket, with no Python backend stub between them; and, in
 * `pooling.c`, a pooling model whose batches go the same way to the model's process.
 *
 * Each request of the model (decoupled: it lasts as long as its job) is sent to the engine loop as
 * one message, in the framing of `workers/triton/generator/backend.py` (the engine loop's side,
 * `workers/triton/generator/job_socket.py`, serves both): the job's bytes, the client's stream and
 * tag from the request's parameters. A thread of the model reads the loop's answers and sends them
 * on the request's response factory: a response (its output tensor's one element), the request's
 * end, or its end with an error. When the loop's socket closes, every request still open ends with
 * an error.
 *
 * Triton loads this library from the model's folder (`libtriton_switchboard.so` beside
 * `config.pbtxt`); a generator's folder holds a file `job_socket` with the socket's path, a pooling
 * model's a file `batch_socket`.
 *
 * Triton's API as far as used here: `triton_api.h`; what both kinds share: `backend.h`.
 */

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

/* ---- The engine loop's framing (workers/triton/generator/backend.py) ---- */

static const char JOB_INPUT[] = "job";
static const char CHUNK_OUTPUT[] = "chunk";
static const char STREAM_PARAMETER[] = "switchboard_stream";
static const char TAG_PARAMETER[] = "switchboard_tag";
static const char SOCKET_FILE[] = "job_socket";
/* The Python side waits as long for the engine loop to listen: it listens before the load. */
static const double CONNECT_WAIT_S = 10.0;

/* Header "<IBQqq": the payload's length, the kind, the request's key, the client's stream, the tag. */
enum { HEADER_SIZE = 4 + 1 + 8 + 8 + 8 };
static const int64_t NO_TAG = -1;
enum { KIND_JOB = 1, KIND_RESPONSE = 2, KIND_END = 3, KIND_FAILED = 4 };

/* ---- One model's state ---- */

/* A request still open, by its key (the requests' keys are handed out upwards). */
typedef struct Open {
  uint64_t key;
  TRITONBACKEND_ResponseFactory* factory;
  struct Open* next;
} Open;

enum { OPEN_BUCKETS = 1024 };

typedef struct Model {
  int kind; /* KIND_GENERATOR */
  char name[256];
  int connection;
  pthread_t reader;
  bool reader_started;
  pthread_mutex_t lock; /* guards `open` and `next_key` */
  pthread_mutex_t write_lock; /* one message at a time on `connection` */
  Open* open[OPEN_BUCKETS];
  uint64_t next_key;
} Model;

/* ---- Open requests (callers hold the model's lock) ---- */

static void
open_add(Model* model, uint64_t key, TRITONBACKEND_ResponseFactory* factory)
{
  Open* entry = malloc(sizeof(Open));
  entry->key = key;
  entry->factory = factory;
  entry->next = model->open[key % OPEN_BUCKETS];
  model->open[key % OPEN_BUCKETS] = entry;
}

static TRITONBACKEND_ResponseFactory*
open_find(Model* model, uint64_t key, bool remove)
{
  for (Open** at = &model->open[key % OPEN_BUCKETS]; *at != NULL; at = &(*at)->next) {
    if ((*at)->key == key) {
      Open* entry = *at;
      TRITONBACKEND_ResponseFactory* factory = entry->factory;
      if (remove) {
        *at = entry->next;
        free(entry);
      }
      return factory;
    }
  }
  return NULL;
}

/* ---- Ending a request ---- */

static void
end_request(TRITONBACKEND_ResponseFactory* factory, const char* error_message)
{
  if (error_message == NULL) {
    forget(TRITONBACKEND_ResponseFactorySendFlags(factory, RESPONSE_COMPLETE_FINAL));
  } else {
    TRITONBACKEND_Response* response;
    TRITONSERVER_Error* error = TRITONBACKEND_ResponseNewFromFactory(&response, factory);
    if (error == NULL) {
      /* Triton reads the error as it sends; it stays the sender's to delete. */
      TRITONSERVER_Error* failed = TRITONSERVER_ErrorNew(ERROR_INTERNAL, error_message);
      forget(TRITONBACKEND_ResponseSend(response, RESPONSE_COMPLETE_FINAL, failed));
      TRITONSERVER_ErrorDelete(failed);
    } else {
      forget(error);
      forget(TRITONBACKEND_ResponseFactorySendFlags(factory, RESPONSE_COMPLETE_FINAL));
    }
  }
  forget(TRITONBACKEND_ResponseFactoryDelete(factory));
}

static void
end_key(Model* model, uint64_t key, const char* error_message)
{
  pthread_mutex_lock(&model->lock);
  TRITONBACKEND_ResponseFactory* factory = open_find(model, key, true);
  pthread_mutex_unlock(&model->lock);
  if (factory != NULL) {
    end_request(factory, error_message);
  }
}

static void
send_response(Model* model, uint64_t key, const uint8_t* payload, uint32_t length)
{
  pthread_mutex_lock(&model->lock);
  TRITONBACKEND_ResponseFactory* factory = open_find(model, key, false);
  pthread_mutex_unlock(&model->lock);
  if (factory == NULL) {
    return;
  }
  /* Only this thread ends a request once it is open, so the factory outlives this send. */
  TRITONBACKEND_Response* response;
  TRITONBACKEND_Output* output;
  void* buffer;
  int memory_type = MEMORY_CPU;
  int64_t memory_type_id = 0;
  const int64_t shape[1] = {1};
  TRITONSERVER_Error* error = TRITONBACKEND_ResponseNewFromFactory(&response, factory);
  if (error != NULL) {
    forget(error);
    return;
  }
  error = TRITONBACKEND_ResponseOutput(response, &output, CHUNK_OUTPUT, TYPE_BYTES, shape, 1);
  if (error == NULL) {
    error = TRITONBACKEND_OutputBuffer(output, &buffer, 4 + (uint64_t)length, &memory_type, &memory_type_id);
  }
  if (error == NULL && memory_type != MEMORY_CPU) {
    error = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "the chunk's output buffer is not in CPU memory");
  }
  if (error != NULL) {
    forget(TRITONBACKEND_ResponseDelete(response));
    forget(error);
    return;
  }
  put_le(buffer, length, 4); /* a BYTES element: its length, then its bytes */
  memcpy((uint8_t*)buffer + 4, payload, length);
  forget(TRITONBACKEND_ResponseSend(response, 0, NULL));
}

/* ---- The engine loop's answers ---- */

static void*
read_answers(void* arg)
{
  Model* model = arg;
  uint8_t header[HEADER_SIZE];
  uint8_t* payload = NULL;
  size_t capacity = 0;
  while (read_exactly(model->connection, header, HEADER_SIZE)) {
    uint32_t length = (uint32_t)get_le(header, 4);
    uint8_t kind = header[4];
    uint64_t key = get_le(header + 5, 8);
    if (length + 1 > capacity) {
      capacity = (size_t)length + 1;
      payload = realloc(payload, capacity);
    }
    if (length > 0 && !read_exactly(model->connection, payload, length)) {
      break;
    }
    payload[length] = 0; /* an error's message is read as a string */
    if (kind == KIND_RESPONSE) {
      send_response(model, key, payload, length);
    } else if (kind == KIND_END) {
      end_key(model, key, NULL);
    } else if (kind == KIND_FAILED) {
      end_key(model, key, (const char*)payload);
    }
  }
  free(payload);
  /* The loop's socket has closed: nobody will answer the requests still open. */
  char message[512];
  snprintf(message, sizeof message, "%s's engine loop ended while the job ran", model->name);
  Open* left = NULL; /* taken out under the lock, ended outside it (ending calls into Triton) */
  pthread_mutex_lock(&model->lock);
  for (int bucket = 0; bucket < OPEN_BUCKETS; bucket++) {
    while (model->open[bucket] != NULL) {
      Open* entry = model->open[bucket];
      model->open[bucket] = entry->next;
      entry->next = left;
      left = entry;
    }
  }
  pthread_mutex_unlock(&model->lock);
  while (left != NULL) {
    Open* next = left->next;
    end_request(left->factory, message);
    free(left);
    left = next;
  }
  return NULL;
}

/* ---- The model's connection ---- */

/* ---- Triton's entry points ---- */

TRITONSERVER_Error*
TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend)
{
  (void)backend;
  uint32_t major, minor;
  TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor);
  if (error != NULL) {
    return error;
  }
  if (major != API_VERSION_MAJOR) {
    return TRITONSERVER_ErrorNew(ERROR_UNAVAILABLE, "the switchboard backend needs Triton's backend API 1.x");
  }
  return NULL;
}

/* Whether the model's folder is a pooling model's (it names its model process's socket). */
static bool
is_pooling(TRITONBACKEND_Model* triton_model)
{
  int artifact_type;
  const char* location;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelRepository(triton_model, &artifact_type, &location);
  if (error != NULL) {
    forget(error);
    return false;
  }
  char file_path[4096];
  snprintf(file_path, sizeof file_path, "%s/%s", location, POOLING_SOCKET_FILE);
  return access(file_path, F_OK) == 0;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* triton_model)
{
  if (is_pooling(triton_model)) {
    void* state;
    TRITONSERVER_Error* error = pooling_model_new(triton_model, &state);
    return error != NULL ? error : TRITONBACKEND_ModelSetState(triton_model, state);
  }
  Model* model = calloc(1, sizeof(Model));
  model->kind = KIND_GENERATOR;
  const char* name = "the model";
  forget(TRITONBACKEND_ModelName(triton_model, &name));
  snprintf(model->name, sizeof model->name, "%s", name);
  pthread_mutex_init(&model->lock, NULL);
  pthread_mutex_init(&model->write_lock, NULL);
  char path[4096];
  TRITONSERVER_Error* error = socket_path(triton_model, SOCKET_FILE, path, sizeof path);
  if (error == NULL) {
    error = connect_to(path, CONNECT_WAIT_S, &model->connection);
  }
  if (error == NULL && pthread_create(&model->reader, NULL, read_answers, model) != 0) {
    close(model->connection);
    error = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "could not start the thread that reads the engine loop's answers");
  }
  if (error != NULL) {
    pthread_mutex_destroy(&model->lock);
    pthread_mutex_destroy(&model->write_lock);
    free(model);
    return error;
  }
  model->reader_started = true;
  return TRITONBACKEND_ModelSetState(triton_model, model);
}

TRITONSERVER_Error*
TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* triton_model)
{
  void* state;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(triton_model, &state);
  if (error != NULL || state == NULL) {
    return error;
  }
  if (*(int*)state == KIND_POOLING) {
    pooling_model_delete(state);
    return NULL;
  }
  Model* model = state;
  /* The reader ends at the connection's end and ends whatever is still open. */
  shutdown(model->connection, SHUT_RDWR);
  if (model->reader_started) {
    pthread_join(model->reader, NULL);
  }
  close(model->connection);
  pthread_mutex_destroy(&model->lock);
  pthread_mutex_destroy(&model->write_lock);
  free(model);
  return NULL;
}

/* A pooling model's instance has its own connection to the model's process; a generator's none. */
TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance)
{
  TRITONBACKEND_Model* triton_model;
  void* state;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &triton_model);
  if (error == NULL) {
    error = TRITONBACKEND_ModelState(triton_model, &state);
  }
  if (error != NULL || *(int*)state != KIND_POOLING) {
    return error;
  }
  void* instance_state;
  error = pooling_instance_new(&instance_state);
  return error != NULL ? error : TRITONBACKEND_ModelInstanceSetState(instance, instance_state);
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance)
{
  void* state = NULL;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceState(instance, &state);
  if (error == NULL && state != NULL) {
    pooling_instance_delete(state);
  }
  return error;
}

/* The job's bytes: the one element of the BYTES input, without its 4-byte length. */
static TRITONSERVER_Error*
read_job(TRITONBACKEND_Request* request, uint8_t** job, uint32_t* job_length)
{
  TRITONBACKEND_Input* input;
  int datatype;
  const int64_t* shape;
  uint32_t dims, buffers;
  uint64_t byte_size;
  TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, JOB_INPUT, &input);
  if (error == NULL) {
    error = TRITONBACKEND_InputProperties(input, NULL, &datatype, &shape, &dims, &byte_size, &buffers);
  }
  if (error != NULL) {
    return error;
  }
  if (datatype != TYPE_BYTES || byte_size < 4) {
    return TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "the job input must be one BYTES element");
  }
  uint8_t* whole = malloc(byte_size);
  uint64_t filled = 0;
  for (uint32_t index = 0; index < buffers && error == NULL; index++) {
    const void* buffer;
    uint64_t size;
    int memory_type;
    int64_t memory_type_id;
    error = TRITONBACKEND_InputBuffer(input, index, &buffer, &size, &memory_type, &memory_type_id);
    if (error == NULL && (memory_type == MEMORY_GPU || filled + size > byte_size)) {
      error = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "the job input is not in CPU memory");
    }
    if (error == NULL) {
      memcpy(whole + filled, buffer, size);
      filled += size;
    }
  }
  uint32_t length = filled >= 4 ? (uint32_t)get_le(whole, 4) : 0;
  if (error == NULL && (filled < 4 || 4 + (uint64_t)length > filled)) {
    error = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "the job input's element is cut short");
  }
  if (error != NULL) {
    free(whole);
    return error;
  }
  *job = whole;
  *job_length = length;
  return NULL;
}

static void
stream_and_tag(TRITONBACKEND_Request* request, int64_t* stream, int64_t* tag)
{
  *stream = 0;
  *tag = NO_TAG;
  uint32_t count = 0;
  forget(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t index = 0; index < count; index++) {
    const char* key;
    int type;
    const void* value;
    if (TRITONBACKEND_RequestParameter(request, index, &key, &type, &value) != NULL || type != PARAMETER_INT) {
      continue;
    }
    if (strcmp(key, STREAM_PARAMETER) == 0) {
      *stream = *(const int64_t*)value;
    } else if (strcmp(key, TAG_PARAMETER) == 0) {
      *tag = *(const int64_t*)value;
    }
  }
}

static void
fail_request(TRITONBACKEND_Request* request, TRITONSERVER_Error* error)
{
  TRITONBACKEND_ResponseFactory* factory;
  TRITONSERVER_Error* failed = TRITONBACKEND_ResponseFactoryNew(&factory, request);
  if (failed != NULL) {
    forget(failed);
    forget(error);
    return;
  }
  end_request(factory, TRITONSERVER_ErrorMessage(error));
  TRITONSERVER_ErrorDelete(error);
}

/* Send one request to the engine loop; false if it could not be (it has then been ended). */
static bool
send_request(Model* model, TRITONBACKEND_Request* request)
{
  uint8_t* job = NULL;
  uint32_t job_length = 0;
  TRITONSERVER_Error* error = read_job(request, &job, &job_length);
  if (error != NULL) {
    fail_request(request, error);
    return false;
  }
  int64_t stream, tag;
  stream_and_tag(request, &stream, &tag);
  TRITONBACKEND_ResponseFactory* factory;
  error = TRITONBACKEND_ResponseFactoryNew(&factory, request);
  if (error != NULL) {
    free(job);
    fail_request(request, error);
    return false;
  }
  uint8_t header[HEADER_SIZE];
  pthread_mutex_lock(&model->lock);
  uint64_t key = model->next_key++;
  open_add(model, key, factory);
  pthread_mutex_unlock(&model->lock);
  put_le(header, job_length, 4);
  header[4] = KIND_JOB;
  put_le(header + 5, key, 8);
  put_le(header + 13, (uint64_t)stream, 8);
  put_le(header + 21, (uint64_t)tag, 8);
  struct iovec parts[2] = {{header, HEADER_SIZE}, {job + 4, job_length}};
  pthread_mutex_lock(&model->write_lock);
  bool sent = send_all(model->connection, parts, 2);
  pthread_mutex_unlock(&model->write_lock);
  free(job);
  if (!sent) {
    char message[600];
    snprintf(message, sizeof message, "%s cannot take jobs: its engine loop is gone (%s)", model->name, strerror(errno));
    end_key(model, key, message);
  }
  return sent;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t request_count)
{
  TRITONBACKEND_Model* triton_model;
  void* state;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &triton_model);
  if (error == NULL) {
    error = TRITONBACKEND_ModelState(triton_model, &state);
  }
  if (error != NULL) {
    return error; /* Triton then fails the requests itself */
  }
  if (*(int*)state == KIND_POOLING) {
    void* instance_state;
    error = TRITONBACKEND_ModelInstanceState(instance, &instance_state);
    if (error != NULL) {
      return error;
    }
    pooling_execute(state, instance_state, instance, requests, request_count);
    return NULL;
  }
  Model* model = state;
  for (uint32_t index = 0; index < request_count; index++) {
    uint64_t start = now_ns();
    bool sent = send_request(model, requests[index]);
    uint64_t end = now_ns();
    forget(TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[index], sent, start, start, end, end));
    forget(TRITONBACKEND_RequestRelease(requests[index], REQUEST_RELEASE_ALL));
  }
  return NULL;
}
