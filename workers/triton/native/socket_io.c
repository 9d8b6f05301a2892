/*
 * What both kinds of the backend's models use to reach the worker's processes: clocks, the
 * little-endian framing, whole reads and writes on a Unix socket, and the socket's path from a file
 * of the model's folder. Declared in `backend.h`; `switchboard_backend.c` (generators) and
 * `pooling.c` (pooling models) each use it, and neither uses the other's helpers.
 */

#include <errno.h>
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

uint64_t
now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The time of day, as Python's time.time_ns() (what the worker's client stamps its requests with). */
uint64_t
wall_clock_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void
forget(TRITONSERVER_Error* error)
{
  if (error != NULL) {
    fprintf(stderr, "switchboard backend: %s\n", TRITONSERVER_ErrorMessage(error));
    TRITONSERVER_ErrorDelete(error);
  }
}

void
put_le(uint8_t* at, uint64_t value, int size)
{
  for (int i = 0; i < size; i++) {
    at[i] = (uint8_t)(value >> (8 * i));
  }
}

uint64_t
get_le(const uint8_t* at, int size)
{
  uint64_t value = 0;
  for (int i = 0; i < size; i++) {
    value |= (uint64_t)at[i] << (8 * i);
  }
  return value;
}

bool
read_exactly(int connection, uint8_t* into, size_t size)
{
  size_t done = 0;
  while (done < size) {
    ssize_t got = recv(connection, into + done, size - done, 0);
    if (got == 0) {
      return false;
    }
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    done += (size_t)got;
  }
  return true;
}

TRITONSERVER_Error*
socket_path(TRITONBACKEND_Model* triton_model, const char* file, char* path, size_t size)
{
  int artifact_type;
  const char* location;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelRepository(triton_model, &artifact_type, &location);
  if (error != NULL) {
    return error;
  }
  char file_path[4096];
  snprintf(file_path, sizeof file_path, "%s/%s", location, file);
  FILE* opened = fopen(file_path, "r");
  if (opened == NULL) {
    char message[256];
    snprintf(message, sizeof message, "the model's folder has no %s file", file);
    return TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, message);
  }
  size_t got = fread(path, 1, size - 1, opened);
  fclose(opened);
  path[got] = 0;
  while (got > 0 && (path[got - 1] == '\n' || path[got - 1] == ' ')) {
    path[--got] = 0;
  }
  return NULL;
}

TRITONSERVER_Error*
connect_to(const char* path, double wait_s, int* connection)
{
  struct sockaddr_un address = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof address.sun_path) {
    return TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "the job socket's path is too long");
  }
  strcpy(address.sun_path, path);
  double waited = 0.0;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return TRITONSERVER_ErrorNew(ERROR_INTERNAL, strerror(errno));
    }
    if (connect(fd, (struct sockaddr*)&address, sizeof address) == 0) {
      *connection = fd;
      return NULL;
    }
    close(fd);
    if (waited > wait_s) {
      char message[4200];
      snprintf(message, sizeof message, "the worker's engine loop does not listen at %s", path);
      return TRITONSERVER_ErrorNew(ERROR_UNAVAILABLE, message);
    }
    usleep(50000);
    waited += 0.05;
  }
}

bool
send_all(int connection, struct iovec* parts, int count)
{
  while (count > 0) {
    struct msghdr message = {.msg_iov = parts, .msg_iovlen = (size_t)count};
    ssize_t sent = sendmsg(connection, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    while (count > 0 && (size_t)sent >= parts->iov_len) {
      sent -= (ssize_t)parts->iov_len;
      parts++;
      count--;
    }
    if (count > 0) {
      parts->iov_base = (uint8_t*)parts->iov_base + sent;
      parts->iov_len -= (size_t)sent;
    }
  }
  return true;
}
