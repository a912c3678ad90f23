/* A C host of include/memexec.h: answers equal the Rust API's serial greedy texts (the oracle
 * header is generated at test time by `cargo run --example host_oracle`), batches keep order,
 * 8 threads x 10 calls agree with the serial answers, and the bad-input matrix gets its
 * documented statuses. Run by scripts/test.d/50-c-host.sh, also under valgrind. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memexec.h"
#include "host_oracle.h"

static int failures = 0;

/* MEMEXEC_HOST_QUICK (the valgrind run, where MLX is ~100x slower): every generation uses the
 * oracle's last case (1 token) and the slowest checks are skipped; the leak check is the point. */
static int quick = 0;
#define CASE(i) (quick ? ORACLE_N - 1 : (i))

/* Prints how long the previous section took (the slow one shows up in CI logs). */
static void section(const char *name) {
  static struct timespec last;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (last.tv_sec != 0) {
    fprintf(stderr, "  %.2fs\n", (double)(now.tv_sec - last.tv_sec) + (double)(now.tv_nsec - last.tv_nsec) / 1e9);
  }
  if (name) fprintf(stderr, "c_host: %s...", name);
  last = now;
}

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      failures++;                                         \
    }                                                     \
  } while (0)

/* Asserts `status` and that the error message contains `needle`; frees the message and clears
 * the caller's pointer. */
static void expect_error(enum memexec_status status, char **errp, enum memexec_status want, const char *needle,
                         const char *what) {
  char *err = *errp;
  *errp = NULL;
  CHECK(status == want, "%s: status %s, want %s (%s)", what, memexec_status_name(status),
        memexec_status_name(want), err ? err : "no message");
  CHECK(err != NULL && strstr(err, needle) != NULL, "%s: message `%s` lacks `%s`", what, err ? err : "(null)",
        needle);
  memexec_string_free(err);
}

/* What an event loop would do between polls. */
static void nap(void) {
  struct timespec ms = {0, 1000000};
  nanosleep(&ms, NULL);
}

static struct memexec *open_engine(const char *extra) {
  char config[4096];
  snprintf(config, sizeof config, "{\"model_dir\": \"%s\"%s}", ORACLE_MODEL_DIR, extra);
  struct memexec *h = NULL;
  char *err = NULL;
  enum memexec_status s = memexec_new(config, &h, &err);
  if (s != MEMEXEC_STATUS_OK) {
    fprintf(stderr, "memexec_new failed: %s: %s\n", memexec_status_name(s), err ? err : "");
    memexec_string_free(err);
    exit(2);
  }
  return h;
}

static void test_serial_calls(struct memexec *h) {
  for (int k = quick ? ORACLE_N - 1 : 0; k < ORACLE_N; k++) {
    int i = k;
    char *out = NULL, *err = NULL;
    enum memexec_status s = memexec_call(h, ORACLE_STAGE[i], ORACLE_INPUT[i], ORACLE_OPTS[i], &out, &err);
    CHECK(s == MEMEXEC_STATUS_OK, "call %d: %s %s", i, memexec_status_name(s), err ? err : "");
    CHECK(out && strcmp(out, ORACLE_TEXT[i]) == 0, "call %d: got `%s`, want `%s`", i, out ? out : "(null)",
          ORACLE_TEXT[i]);
    memexec_string_free(out);
    memexec_string_free(err);
  }
}

static void test_batch(struct memexec *h) {
  char *out = NULL, *err = NULL;
  enum memexec_status s;
  if (quick) goto empty;
  s = memexec_batch(h, ORACLE_BATCH_STAGE, ORACLE_BATCH_INPUTS, ORACLE_BATCH_OPTS, &out, &err);
  CHECK(s == MEMEXEC_STATUS_OK, "batch: %s %s", memexec_status_name(s), err ? err : "");
  CHECK(out && strcmp(out, ORACLE_BATCH_TEXTS) == 0, "batch: got %s, want %s", out ? out : "(null)",
        ORACLE_BATCH_TEXTS);
  memexec_string_free(out);
  memexec_string_free(err);

empty:;
  out = NULL;
  s = memexec_batch(h, "chunk", "[]", NULL, &out, NULL);
  CHECK(s == MEMEXEC_STATUS_OK && out && strcmp(out, "[]") == 0, "empty batch: %s `%s`", memexec_status_name(s),
        out ? out : "(null)");
  memexec_string_free(out);
}

static void test_submit_poll_cancel(struct memexec *h) {
  uint64_t id = 0;
  char *out = NULL, *err = NULL;
  int c = CASE(0);
  enum memexec_status s = memexec_submit(h, ORACLE_STAGE[c], ORACLE_INPUT[c], ORACLE_OPTS[c], &id, &err);
  CHECK(s == MEMEXEC_STATUS_OK && id != 0, "submit: %s", memexec_status_name(s));
  while ((s = memexec_poll(h, id, &out, &err)) == MEMEXEC_STATUS_PENDING) nap();
  CHECK(s == MEMEXEC_STATUS_OK && out && strcmp(out, ORACLE_TEXT[c]) == 0, "poll: %s `%s`", memexec_status_name(s),
        out ? out : "(null)");
  memexec_string_free(out);
  out = NULL;
  s = memexec_poll(h, id, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_UNKNOWN_REQUEST, "unknown request id", "poll twice");
  err = NULL;

  /* A long request (the oracle checked it runs 200 steps without EOS), cancelled at once. */
  s = memexec_submit(h, ORACLE_LONG_STAGE, ORACLE_LONG_INPUT, "{\"max_tokens\": 64000}", &id, NULL);
  CHECK(s == MEMEXEC_STATUS_OK, "submit long: %s", memexec_status_name(s));
  CHECK(memexec_cancel(h, id, NULL) == MEMEXEC_STATUS_OK, "cancel");
  while ((s = memexec_poll(h, id, &out, &err)) == MEMEXEC_STATUS_PENDING) nap();
  expect_error(s, &err, MEMEXEC_STATUS_CANCELLED, "cancelled", "poll cancelled");
  err = NULL;
  s = memexec_cancel(h, 987654, &err);
  expect_error(s, &err, MEMEXEC_STATUS_UNKNOWN_REQUEST, "987654", "cancel unknown");

  /* Empty batch through submit. */
  out = NULL;
  s = memexec_submit_batch(h, "chunk", "[]", NULL, &id, NULL);
  CHECK(s == MEMEXEC_STATUS_OK, "submit empty batch");
  s = memexec_poll(h, id, &out, NULL);
  CHECK(s == MEMEXEC_STATUS_OK && out && strcmp(out, "[]") == 0, "poll empty batch");
  memexec_string_free(out);
}

struct worker {
  struct memexec *h;
  int index;
  int calls;
  int bad;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  for (int k = 0; k < w->calls; k++) {
    int i = CASE((w->index * w->calls + k) % ORACLE_N);
    char *out = NULL, *err = NULL;
    enum memexec_status s = memexec_call(w->h, ORACLE_STAGE[i], ORACLE_INPUT[i], ORACLE_OPTS[i], &out, &err);
    if (s != MEMEXEC_STATUS_OK || strcmp(out, ORACLE_TEXT[i]) != 0) {
      fprintf(stderr, "thread %d call %d (case %d): %s `%s`\n", w->index, k, i, memexec_status_name(s),
              out ? out : (err ? err : ""));
      w->bad++;
    }
    memexec_string_free(out);
    memexec_string_free(err);
  }
  return NULL;
}

static void test_threads(struct memexec *h, int n_threads, int calls) {
  pthread_t threads[8];
  struct worker workers[8];
  for (int t = 0; t < n_threads; t++) {
    workers[t] = (struct worker){h, t, calls, 0};
    pthread_create(&threads[t], NULL, worker_main, &workers[t]);
  }
  for (int t = 0; t < n_threads; t++) {
    pthread_join(threads[t], NULL);
    CHECK(workers[t].bad == 0, "thread %d: %d wrong answers", t, workers[t].bad);
  }
}

static void test_bad_inputs(struct memexec *h) {
  char *out = NULL, *err = NULL;
  enum memexec_status s;

  s = memexec_call(h, NULL, "{\"user\":\"a\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_NULL_ARGUMENT, "`stage`", "NULL stage");
  s = memexec_call(h, "x", NULL, NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_NULL_ARGUMENT, "`input_json`", "NULL input");
  s = memexec_call(h, "x", "{\"user\":\"a\"}", NULL, NULL, &err);
  expect_error(s, &err, MEMEXEC_STATUS_NULL_ARGUMENT, "`out_text`", "NULL out_text");
  s = memexec_call(h, "\xff\xfe", "{\"user\":\"a\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_UTF8, "`stage`", "invalid UTF-8 stage");
  s = memexec_call(h, "x", "{\"user\":\"\xc3\x28\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_UTF8, "`input_json`", "invalid UTF-8 input");
  s = memexec_call(h, "x", "{\"user\":", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "input_json", "malformed input");
  s = memexec_call(h, "x", "{\"user\":\"a\",\"sytem\":\"b\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "unknown field `sytem`", "unknown input key");
  s = memexec_call(h, "x", "{\"system\":\"a\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "missing field `user`", "missing user");
  s = memexec_call(h, "x", "{\"user\":\"a\"}", "{\"max_tokens\":0}", &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_ARGUMENT, "max_tokens", "max_tokens 0");
  s = memexec_call(h, "x", "{\"user\":\"a\"}", "{\"max_tokens\":64001}", &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_ARGUMENT, "64000", "max_tokens above the cap");
  s = memexec_call(h, "x", "{\"user\":\"a\"}", "{\"max_tokens\":-1}", &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "opts_json", "negative max_tokens");
  s = memexec_call(h, "x", "{\"user\":\"a\"}", "{\"maxTokens\":4}", &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "unknown field `maxTokens`", "unknown opts key");
  s = memexec_batch(h, "x", "{\"user\":\"a\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "inputs_json", "batch not an array");

  /* A batch above limits.max_batch (4096 by default). */
  size_t n = 4097, each = strlen("{\"user\":\"a\"},");
  char *huge = malloc(n * each + 3);
  char *p = huge;
  *p++ = '[';
  for (size_t i = 0; i < n; i++) p += sprintf(p, "{\"user\":\"a\"}%s", i + 1 < n ? "," : "");
  *p++ = ']';
  *p = 0;
  s = memexec_batch(h, "x", huge, NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_ARGUMENT, "max_batch", "huge batch");
  free(huge);

  if (quick) goto usable;
  /* A prompt longer than the model's context. */
  size_t words = ORACLE_MAX_CONTEXT + 16;
  char *long_user = malloc(words * 6 + 64);
  p = long_user + sprintf(long_user, "{\"user\":\"");
  for (size_t i = 0; i < words; i++) p += sprintf(p, " hello");
  sprintf(p, "\"}");
  s = memexec_call(h, "x", long_user, NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_PROMPT_TOO_LONG, "context", "over-context prompt");
  free(long_user);

  /* Unknown stages are accepted: no default system, no adapter (SPEC 1). */
  s = memexec_call(h, "no-such-stage", ORACLE_UNKNOWN_STAGE_INPUT, "{\"max_tokens\":8}", &out, &err);
  CHECK(s == MEMEXEC_STATUS_OK && out && strcmp(out, ORACLE_UNKNOWN_STAGE_TEXT) == 0, "unknown stage: %s `%s`",
        memexec_status_name(s), out ? out : (err ? err : ""));
  memexec_string_free(out);
  memexec_string_free(err);
  out = NULL;
  err = NULL;

usable:;
  /* The handle still answers after every error above. */
  int c = CASE(0);
  s = memexec_call(h, ORACLE_STAGE[c], ORACLE_INPUT[c], ORACLE_OPTS[c], &out, &err);
  CHECK(s == MEMEXEC_STATUS_OK && strcmp(out, ORACLE_TEXT[c]) == 0, "still usable");
  memexec_string_free(out);
  memexec_string_free(err);

  char *stats = NULL;
  CHECK(memexec_stats(h, &stats, NULL) == MEMEXEC_STATUS_OK && strstr(stats, "\"tokens_out\":"), "stats");
  memexec_string_free(stats);
}

static void test_new_errors(void) {
  struct memexec *h = NULL;
  char *err = NULL;
  enum memexec_status s;
  s = memexec_new(NULL, &h, &err);
  expect_error(s, &err, MEMEXEC_STATUS_NULL_ARGUMENT, "config_json", "NULL config");
  s = memexec_new("{\"model_dir\":\"/x\"}", NULL, &err);
  expect_error(s, &err, MEMEXEC_STATUS_NULL_ARGUMENT, "out_handle",
               "NULL out_handle");
  s = memexec_new("{", &h, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON, "config", "malformed config");
  s = memexec_new("{\"model_dir\":\"/x\",\"adapterz\":{}}", &h, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_JSON,
               "unknown field `adapterz`", "unknown config key");
  s = memexec_new("{\"model_dir\":\"/nonexistent/memexec\"}", &h, &err);
  expect_error(s, &err, MEMEXEC_STATUS_LOAD_FAILED,
               "/nonexistent/memexec", "missing model dir");
  CHECK(h == NULL, "out_handle written on failure");
  /* Without an out_error, the status still tells. */
  CHECK(memexec_new("{", &h, NULL) == MEMEXEC_STATUS_INVALID_JSON, "NULL out_error");
}

struct in_flight {
  struct memexec *h;
  enum memexec_status status;
};

static void *long_call(void *arg) {
  struct in_flight *f = arg;
  char *out = NULL, *err = NULL;
  f->status = memexec_call(f->h, ORACLE_LONG_STAGE, ORACLE_LONG_INPUT, "{\"max_tokens\": 64000}", &out, &err);
  memexec_string_free(out);
  memexec_string_free(err);
  return NULL;
}

static void test_free_in_flight(void) {
  struct memexec *h = open_engine("");
  pthread_t t[3];
  struct in_flight f[3];
  for (int i = 0; i < 3; i++) {
    f[i] = (struct in_flight){h, MEMEXEC_STATUS_INTERNAL};
    pthread_create(&t[i], NULL, long_call, &f[i]);
  }
  uint64_t id = 0;
  CHECK(memexec_submit(h, ORACLE_LONG_STAGE, ORACLE_LONG_INPUT, "{\"max_tokens\":64000}", &id, NULL) ==
            MEMEXEC_STATUS_OK,
        "submit before free");
  CHECK(memexec_free(h) == MEMEXEC_STATUS_OK, "free with calls in flight");
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    /* Closed mid-generation, or (a thread that had not yet entered its call) a freed handle. */
    CHECK(f[i].status == MEMEXEC_STATUS_CLOSED || f[i].status == MEMEXEC_STATUS_INVALID_HANDLE,
          "in-flight call %d ended with %s", i, memexec_status_name(f[i].status));
  }
  char *out = NULL, *err = NULL;
  enum memexec_status s = memexec_call(h, "x", "{\"user\":\"a\"}", NULL, &out, &err);
  expect_error(s, &err, MEMEXEC_STATUS_INVALID_HANDLE,
               "invalid handle", "call after free");
  CHECK(memexec_poll(h, id, &out, NULL) == MEMEXEC_STATUS_INVALID_HANDLE, "poll after free");
  CHECK(memexec_free(h) == MEMEXEC_STATUS_INVALID_HANDLE, "double free");
}

int main(void) {
  quick = getenv("MEMEXEC_HOST_QUICK") != NULL;
  CHECK(memexec_abi_version() == MEMEXEC_ABI_VERSION, "abi version");
  section("new errors");
  test_new_errors();
  section("load");
  struct memexec *h = open_engine("");
  section("serial calls");
  test_serial_calls(h);
  section("batch");
  test_batch(h);
  section("submit/poll/cancel");
  test_submit_poll_cancel(h);
  section("threads");
  /* Under valgrind (MEMEXEC_HOST_QUICK) a lighter load: the leak check is the point there. */
  test_threads(h, quick ? 2 : 8, quick ? 2 : 10);
  section("bad inputs");
  test_bad_inputs(h);
  CHECK(memexec_free(h) == MEMEXEC_STATUS_OK, "free");
  section("free in flight");
  test_free_in_flight();
  section(NULL);
  if (failures) {
    fprintf(stderr, "c_host: %d failure(s)\n", failures);
    return 1;
  }
  printf(quick ? "c_host: quick checks passed\n"
               : "c_host: all checks passed (%d oracle cases, batch of 5, 8x10 threaded calls)\n",
         ORACLE_N);
  return 0;
}
