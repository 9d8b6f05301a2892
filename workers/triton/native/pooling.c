/*
 * A pooling model on the worker's own backend: each batch that Triton's dynamic batcher gathers goes
 * from Triton's model thread straight to the model's process over a Unix socket, with no Python
 * backend stub between them (and so no shared memory region in /dev/shm that another local user
 * could open while the stub starts: every row of every batch crossed one).
 *
 * The same exchange as `workers/triton/pooling/backend.py` (the Python stub this replaces where the
 * backend is built): the batch's rows go in one message of `multiprocessing.connection`'s framing
 * (a 4-byte big-endian length, then the bytes), which the model's process
 * (`workers/engines/torch_pooling/process.py`) reads with `recv_bytes`; the rows are items of a 4-byte
 * little-endian length and the bytes, Triton's own BYTES layout, so a request's input is copied as it
 * is. The answer's first byte says whether the items that follow are the rows' answers (OK) or one
 * error message (FAILED); each request gets exactly its own rows' answers, in order, and per row
 * the batch's rows, how long the request was held before the batch ran, and 1 on the batch's first
 * row (`BATCH_OUTPUT`).
 *
 * Each instance has its own connection, made at its first batch and again after the process was
 * replaced (its batch then fails: the process ended during it).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

static const char ROWS_INPUT[] = "rows";
static const char ANSWERS_OUTPUT[] = "answers";
static const char BATCH_OUTPUT[] = "batch";
static const char SENT_PARAMETER[] = "sent_ns";
enum { BATCH_COLUMNS = 3 };
/* How long a batch waits for the model's process to listen (it is being started, or restarted). */
static const double CONNECT_WAIT_S = 10.0;
enum { ANSWER_OK = 0, ANSWER_FAILED = 1 };
/* Every item: its 4-byte length, then its bytes. */
enum { ITEM_LENGTH = 4 };

typedef struct PoolingModel {
  int kind; /* KIND_POOLING */
  char name[256];
  char socket[4096];
} PoolingModel;

typedef struct PoolingInstance {
  int connection; /* -1 until its first batch, and after the model's process ended */
} PoolingInstance;

/* One request of the batch: its rows' place in the message, then its answers' place in the reply. */
typedef struct Part {
  TRITONBACKEND_Request* request;
  uint64_t rows;
  int64_t sent_ns;
  char* error; /* its own input's fault: it is answered with this alone */
  size_t answers_at, answers_size;
} Part;

typedef struct Bytes {
  uint8_t* data;
  size_t size, capacity;
} Bytes;

static void
bytes_reserve(Bytes* bytes, size_t more)
{
  if (bytes->size + more <= bytes->capacity) {
    return;
  }
  size_t capacity = bytes->capacity ? bytes->capacity : 4096;
  while (capacity < bytes->size + more) {
    capacity *= 2;
  }
  bytes->data = realloc(bytes->data, capacity);
  bytes->capacity = capacity;
}

static char*
message_of(const char* format, const char* name, const char* detail)
{
  size_t size = strlen(format) + strlen(name) + strlen(detail) + 1;
  char* message = malloc(size);
  snprintf(message, size, format, name, detail);
  return message;
}

/* ---- The model and its instances ---- */

TRITONSERVER_Error*
pooling_model_new(TRITONBACKEND_Model* triton_model, void** state)
{
  PoolingModel* model = calloc(1, sizeof(PoolingModel));
  model->kind = KIND_POOLING;
  const char* name = "the model";
  forget(TRITONBACKEND_ModelName(triton_model, &name));
  snprintf(model->name, sizeof model->name, "%s", name);
  TRITONSERVER_Error* error = socket_path(triton_model, POOLING_SOCKET_FILE, model->socket, sizeof model->socket);
  if (error != NULL) {
    free(model);
    return error;
  }
  *state = model;
  return NULL;
}

void
pooling_model_delete(void* state)
{
  free(state);
}

TRITONSERVER_Error*
pooling_instance_new(void** state)
{
  PoolingInstance* instance = calloc(1, sizeof(PoolingInstance));
  instance->connection = -1;
  *state = instance;
  return NULL;
}

void
pooling_instance_delete(void* state)
{
  PoolingInstance* instance = state;
  if (instance->connection >= 0) {
    close(instance->connection);
  }
  free(instance);
}

/* ---- The batch's rows, from its requests ---- */

static int64_t
sent_ns_of(TRITONBACKEND_Request* request, int64_t otherwise)
{
  uint32_t count = 0;
  forget(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t index = 0; index < count; index++) {
    const char* key;
    int type;
    const void* value;
    if (TRITONBACKEND_RequestParameter(request, index, &key, &type, &value) == NULL && type == PARAMETER_INT &&
        strcmp(key, SENT_PARAMETER) == 0) {
      return *(const int64_t*)value;
    }
  }
  return otherwise;
}

/* How many whole items `data` holds, or -1 if it is not a run of whole items. */
static int64_t
items_in(const uint8_t* data, size_t size)
{
  int64_t count = 0;
  size_t at = 0;
  while (at < size) {
    if (size - at < ITEM_LENGTH) {
      return -1;
    }
    uint64_t length = get_le(data + at, ITEM_LENGTH);
    if (size - at - ITEM_LENGTH < length) {
      return -1;
    }
    at += ITEM_LENGTH + length;
    count++;
  }
  return count;
}

/* Append the request's rows to `message` as they are (Triton's BYTES layout is the message's). */
static char*
add_rows(TRITONBACKEND_Request* request, Bytes* message, uint64_t* rows)
{
  TRITONBACKEND_Input* input;
  int datatype;
  const int64_t* shape;
  uint32_t dims, buffers;
  uint64_t byte_size;
  TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, ROWS_INPUT, &input);
  if (error == NULL) {
    error = TRITONBACKEND_InputProperties(input, NULL, &datatype, &shape, &dims, &byte_size, &buffers);
  }
  if (error != NULL) {
    char* message_text = strdup(TRITONSERVER_ErrorMessage(error));
    TRITONSERVER_ErrorDelete(error);
    return message_text;
  }
  uint64_t elements = 1;
  for (uint32_t dim = 0; dim < dims; dim++) {
    elements *= (uint64_t)shape[dim];
  }
  if (datatype != TYPE_BYTES) {
    return strdup("the rows input must be BYTES");
  }
  size_t start = message->size;
  bytes_reserve(message, byte_size);
  for (uint32_t index = 0; index < buffers; index++) {
    const void* buffer;
    uint64_t size;
    int memory_type;
    int64_t memory_type_id;
    error = TRITONBACKEND_InputBuffer(input, index, &buffer, &size, &memory_type, &memory_type_id);
    if (error == NULL && (memory_type == MEMORY_GPU || message->size - start + size > byte_size)) {
      error = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "the rows input is not in CPU memory");
    }
    if (error != NULL) {
      message->size = start;
      char* message_text = strdup(TRITONSERVER_ErrorMessage(error));
      TRITONSERVER_ErrorDelete(error);
      return message_text;
    }
    memcpy(message->data + message->size, buffer, size);
    message->size += size;
  }
  if (items_in(message->data + start, message->size - start) != (int64_t)elements) {
    message->size = start;
    return strdup("the rows input is not one element per row");
  }
  *rows = elements;
  return NULL;
}

/* ---- The exchange with the model's process ---- */

/* Send the message, read the reply (its bytes in `*reply`); an error message if either failed. */
static char*
exchange(PoolingModel* model, PoolingInstance* instance, Bytes* message, uint8_t** reply, size_t* reply_size)
{
  if (instance->connection < 0) {
    TRITONSERVER_Error* error = connect_to(model->socket, CONNECT_WAIT_S, &instance->connection);
    if (error != NULL) {
      TRITONSERVER_ErrorDelete(error);
      instance->connection = -1;
      return message_of(
          "%s failed a batch: the model's process does not listen at %s; the worker's log may say why",
          model->name, model->socket);
    }
  }
  /* multiprocessing.connection's header: the length, big-endian; past 2 GiB, -1 and 8 bytes. */
  uint8_t header[12];
  size_t header_size = 4;
  uint64_t length = message->size;
  if (length > 0x7fffffff) {
    memcpy(header, "\xff\xff\xff\xff", 4);
    for (int i = 0; i < 8; i++) {
      header[4 + i] = (uint8_t)(length >> (8 * (7 - i)));
    }
    header_size = 12;
  } else {
    for (int i = 0; i < 4; i++) {
      header[i] = (uint8_t)(length >> (8 * (3 - i)));
    }
  }
  struct iovec parts[2] = {{header, header_size}, {message->data, message->size}};
  uint8_t size_bytes[8];
  bool done = send_all(instance->connection, parts, 2) && read_exactly(instance->connection, size_bytes, 4);
  uint64_t size = 0;
  if (done) {
    size = ((uint64_t)size_bytes[0] << 24) | ((uint64_t)size_bytes[1] << 16) | ((uint64_t)size_bytes[2] << 8) |
           size_bytes[3];
    if (size == 0xffffffffu) {
      done = read_exactly(instance->connection, size_bytes, 8);
      size = 0;
      for (int i = 0; done && i < 8; i++) {
        size = (size << 8) | size_bytes[i];
      }
    }
  }
  if (done) {
    *reply = malloc(size ? size : 1);
    done = read_exactly(instance->connection, *reply, size);
    if (!done) {
      free(*reply);
    }
  }
  if (!done) {
    /* The process ended (killed, or it died): the next batch reaches its replacement. */
    close(instance->connection);
    instance->connection = -1;
    return message_of("%s failed a batch: %s", model->name,
                      "the model's process ended during the batch; it is being restarted");
  }
  *reply_size = size;
  return NULL;
}

/* Find each part's answers in the reply; an error message if the reply does not answer every row. */
static char*
place_answers(PoolingModel* model, const uint8_t* reply, size_t reply_size, Part* parts, uint32_t count)
{
  if (reply_size < 1) {
    return message_of("%s failed a batch: %s", model->name, "the model's process answered nothing");
  }
  if (reply[0] != ANSWER_OK) {
    char* detail = strndup((const char*)reply + 1, reply_size - 1);
    char* message = message_of("%s failed a batch: %s", model->name, detail);
    free(detail);
    return message;
  }
  uint64_t wanted = 0;
  for (uint32_t index = 0; index < count; index++) {
    wanted += parts[index].error == NULL ? parts[index].rows : 0;
  }
  int64_t answered = items_in(reply + 1, reply_size - 1);
  if (answered != (int64_t)wanted) {
    char detail[128];
    snprintf(detail, sizeof detail, "the model's process answered %lld rows of %llu", (long long)answered,
             (unsigned long long)wanted);
    return message_of("%s failed a batch: %s", model->name, detail);
  }
  size_t at = 1;
  for (uint32_t index = 0; index < count; index++) {
    Part* part = &parts[index];
    if (part->error != NULL) {
      continue;
    }
    part->answers_at = at;
    for (uint64_t row = 0; row < part->rows; row++) {
      at += ITEM_LENGTH + get_le(reply + at, ITEM_LENGTH);
    }
    part->answers_size = at - part->answers_at;
  }
  return NULL;
}

/* ---- Answering the requests ---- */

static TRITONSERVER_Error*
add_output(TRITONBACKEND_Response* response, const char* name, int datatype, const int64_t* shape,
           const void* data, uint64_t size)
{
  TRITONBACKEND_Output* output;
  void* buffer;
  int memory_type = MEMORY_CPU;
  int64_t memory_type_id = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ResponseOutput(response, &output, name, datatype, shape, 2);
  if (error == NULL) {
    error = TRITONBACKEND_OutputBuffer(output, &buffer, size, &memory_type, &memory_type_id);
  }
  if (error == NULL && memory_type != MEMORY_CPU) {
    error = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "the output buffer is not in CPU memory");
  }
  if (error == NULL) {
    memcpy(buffer, data, size);
  }
  return error;
}

/* Send the request its answers (or `error_message`); whether it was answered without an error. */
static bool
respond(TRITONBACKEND_Request* request, const char* error_message, const uint8_t* answers, const Part* part,
        const uint8_t* batch)
{
  TRITONBACKEND_Response* response;
  TRITONSERVER_Error* error = TRITONBACKEND_ResponseNew(&response, request);
  if (error != NULL) {
    forget(error);
    return false;
  }
  if (error_message == NULL) {
    const int64_t answers_shape[2] = {(int64_t)part->rows, 1};
    const int64_t batch_shape[2] = {(int64_t)part->rows, BATCH_COLUMNS};
    error = add_output(response, ANSWERS_OUTPUT, TYPE_BYTES, answers_shape, answers, part->answers_size);
    if (error == NULL) {
      error = add_output(response, BATCH_OUTPUT, TYPE_INT64, batch_shape, batch, part->rows * BATCH_COLUMNS * 8);
    }
  } else {
    error = TRITONSERVER_ErrorNew(ERROR_INTERNAL, error_message);
  }
  bool answered = error == NULL;
  forget(TRITONBACKEND_ResponseSend(response, RESPONSE_COMPLETE_FINAL, error));
  if (error != NULL) {
    TRITONSERVER_ErrorDelete(error);
  }
  return answered;
}

/* The part's batch columns: the batch's rows, the time its request was held, 1 on the first row. */
static uint8_t*
batch_columns(const Part* part, uint64_t total_rows, int64_t arrived_ns, bool first)
{
  uint8_t* batch = calloc(part->rows * BATCH_COLUMNS, 8);
  int64_t held_ns = arrived_ns > part->sent_ns ? arrived_ns - part->sent_ns : 0;
  for (uint64_t row = 0; row < part->rows; row++) {
    uint8_t* at = batch + row * BATCH_COLUMNS * 8;
    put_le(at, total_rows, 8);
    put_le(at + 8, (uint64_t)held_ns, 8);
    put_le(at + 16, row == 0 && first ? 1 : 0, 8);
  }
  return batch;
}

void
pooling_execute(
    void* model_state, void* instance_state, TRITONBACKEND_ModelInstance* instance,
    TRITONBACKEND_Request** requests, uint32_t request_count)
{
  PoolingModel* model = model_state;
  uint64_t exec_start = now_ns();
  int64_t arrived_ns = (int64_t)wall_clock_ns();
  Part* parts = calloc(request_count, sizeof(Part));
  Bytes message = {0};
  uint64_t total_rows = 0;
  for (uint32_t index = 0; index < request_count; index++) {
    parts[index].request = requests[index];
    parts[index].sent_ns = sent_ns_of(requests[index], arrived_ns);
    parts[index].error = add_rows(requests[index], &message, &parts[index].rows);
    total_rows += parts[index].error == NULL ? parts[index].rows : 0;
  }
  uint64_t compute_start = now_ns();
  uint8_t* reply = NULL;
  size_t reply_size = 0;
  char* failed = total_rows ? exchange(model, instance_state, &message, &reply, &reply_size) : NULL;
  if (failed == NULL && total_rows) {
    failed = place_answers(model, reply, reply_size, parts, request_count);
  }
  uint64_t compute_end = now_ns();
  bool first = true;
  for (uint32_t index = 0; index < request_count; index++) {
    Part* part = &parts[index];
    bool answered;
    if (part->error != NULL || failed != NULL) {
      answered = respond(part->request, part->error != NULL ? part->error : failed, NULL, part, NULL);
    } else {
      uint8_t* batch = batch_columns(part, total_rows, arrived_ns, first);
      first = false;
      answered = respond(part->request, NULL, reply + part->answers_at, part, batch);
      free(batch);
    }
    uint64_t exec_end = now_ns();
    forget(TRITONBACKEND_ModelInstanceReportStatistics(
        instance, part->request, answered, exec_start, compute_start, compute_end, exec_end));
    forget(TRITONBACKEND_RequestRelease(part->request, REQUEST_RELEASE_ALL));
    free(part->error);
  }
  if (total_rows) {
    forget(TRITONBACKEND_ModelInstanceReportBatchStatistics(
        instance, total_rows, exec_start, compute_start, compute_end, now_ns()));
  }
  free(failed);
  free(reply);
  free(message.data);
  free(parts);
}
