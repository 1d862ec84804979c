// test_safetensors.c — round trip, and every kind of damaged file is refused with
// a clear error: truncated, bit-flipped data, bit-flipped header, garbage, overlap.
#include "harness.h"
#include "core/safetensors.h"
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void write_sample(const char *path, float *a, int *b) {
    lm_st_entry e[2] = {
        {.name = "a.weight", .dtype = LM_ST_F32, .ndim = 2, .shape = {3, 4}, .data = a},
        {.name = "b.idx", .dtype = LM_ST_I32, .ndim = 1, .shape = {5}, .data = b},
    };
    const char *k[1] = {"config"}, *v[1] = {"{\"d_model\": 4}"};
    assert_int_equal(lm_st_write(path, e, 2, k, v, 1), LM_OK);
}

static void test_roundtrip(void **state) {
    (void)state;
    float a[12];
    int b[5] = {1, -2, 3, 4, 5};
    for (int i = 0; i < 12; i++) a[i] = 0.5f * i - 1;
    char path[300];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    write_sample(path, a, b);
    lm_safetensors st;
    assert_int_equal(lm_st_open(&st, path), LM_OK);
    assert_int_equal(st.n, 2);
    assert_string_equal(lm_st_meta(&st, "config"), "{\"d_model\": 4}");
    const lm_st_tensor *t = lm_st_find(&st, "a.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 4);
    real out[12];
    assert_int_equal(lm_st_read_real(&st, t, out, 12), LM_OK);
    for (int i = 0; i < 12; i++) assert_true(out[i] == (real)a[i]);
    int ib[5];
    assert_int_equal(lm_st_read_i32(&st, lm_st_find(&st, "b.idx"), ib, 5), LM_OK);
    assert_memory_equal(ib, b, sizeof b);
    assert_int_equal(lm_st_read_real(&st, t, out, 11), LM_ERR);   // wrong size requested
    assert_null(lm_st_find(&st, "missing"));
    lm_st_close(&st);
}

// corrupts a copy of a good file with `edit` and expects a refusal mentioning `word`
static void expect_refused(const char *label, void (*edit)(uint8_t *, size_t *), const char *word) {
    float a[12] = {0};
    int b[5] = {0};
    char path[300];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, label);
    write_sample(path, a, b);
    size_t n;
    uint8_t *buf = lm_read_file(path, &n);
    edit(buf, &n);
    assert_int_equal(lm_write_file_atomic(path, buf, n), LM_OK);
    free(buf);
    lm_safetensors st;
    assert_int_equal(lm_st_open(&st, path), LM_ERR);
    printf("refused %s: %s\n", label, lm_last_error());
    assert_non_null(strstr(lm_last_error(), word));
}

static void truncate_tail(uint8_t *b, size_t *n) { (void)b; *n -= 7; }
static void truncate_head(uint8_t *b, size_t *n) { (void)b; *n = 5; }
static void flip_data(uint8_t *b, size_t *n) { b[*n - 3] ^= 0x10; }
static void flip_len(uint8_t *b, size_t *n) { (void)n; b[6] ^= 0x01; }
static void garbage(uint8_t *b, size_t *n) { memcpy(b, "GARBAGE!GARBAGE!", 16); (void)n; }
static void flip_header(uint8_t *b, size_t *n) {
    // turn the first '{' of the JSON into something else
    (void)n;
    b[8] = 'x';
}

static void test_damaged_files(void **state) {
    (void)state;
    expect_refused("truncated", truncate_tail, "trunc");
    expect_refused("tiny", truncate_head, "trunc");
    expect_refused("bitflip_data", flip_data, "checksum");
    expect_refused("bitflip_len", flip_len, "corrupt");
    expect_refused("garbage", garbage, "corrupt");
    expect_refused("bad_json", flip_header, "corrupt");
    lm_safetensors st;
    assert_int_equal(lm_st_open(&st, "/nonexistent/dir/file.safetensors"), LM_ERR);
    assert_non_null(strstr(lm_last_error(), "cannot open"));
}

static void test_overlap_refused(void **state) {
    (void)state;
    const char *js = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    size_t jl = strlen(js);
    uint8_t buf[512] = {0};
    buf[0] = (uint8_t)jl;
    memcpy(buf + 8, js, jl);
    char path[300];
    snprintf(path, sizeof path, "%s/overlap.safetensors", dir);
    assert_int_equal(lm_write_file_atomic(path, buf, 8 + jl + 12), LM_OK);
    lm_safetensors st;
    assert_int_equal(lm_st_open(&st, path), LM_ERR);
    assert_non_null(strstr(lm_last_error(), "overlap"));
}

static void test_crc_known_value(void **state) {
    (void)state;
    // the standard check value of CRC-32/ISO-HDLC
    assert_int_equal(lm_crc32(0, "123456789", 9), 0xCBF43926u);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/linmoe_st_test_%d", (int)getpid());
    mkdir(dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip), cmocka_unit_test(test_damaged_files),
        cmocka_unit_test(test_overlap_refused), cmocka_unit_test(test_crc_known_value),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) r = 1;
    return r;
}
