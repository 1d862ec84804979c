// safetensors.h — read and write the safetensors format (HF-compatible): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, …,
// "__metadata__": {string: string}}, then the raw tensor bytes.
//
// linmoe adds one metadata entry, "linmoe_crc32", the CRC-32 of the data section, so a
// truncated or bit-flipped file is refused instead of silently loaded. Files without it
// (from other tools) are accepted. Writes are atomic: a temporary file in the same
// folder, fsync, rename over the target, fsync of the folder — a crash at any point
// leaves either the old file or the new one.
#ifndef LM_SAFETENSORS_H
#define LM_SAFETENSORS_H
#include "core/common.h"

typedef enum { LM_ST_F32 = 0, LM_ST_F64, LM_ST_I32, LM_ST_BF16, LM_ST_U8, LM_ST_I64 } lm_st_dtype;

typedef struct {
    char name[LM_NAME_MAX];
    lm_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    size_t numel;
    size_t begin, end;         // byte range inside the data section
} lm_st_tensor;

typedef struct {
    lm_st_tensor *t;
    int n;
    char **meta_keys, **meta_vals;
    int n_meta;
    uint8_t *file;             // the whole file
    size_t file_size;
    const uint8_t *data;       // start of the data section
    size_t data_size;
} lm_safetensors;

// Reads and validates a file. On error returns LM_ERR with lm_last_error() saying what
// is wrong (missing, truncated, bad header, overlapping tensors, checksum mismatch…).
lm_status lm_st_open(lm_safetensors *st, const char *path);
void lm_st_close(lm_safetensors *st);
const lm_st_tensor *lm_st_find(const lm_safetensors *st, const char *name);
const char *lm_st_meta(const lm_safetensors *st, const char *key);   // NULL if absent
// Copies a tensor into `out` (count elements) converting F32/F64/BF16 to `real`.
lm_status lm_st_read_real(const lm_safetensors *st, const lm_st_tensor *t, real *out, size_t count);
lm_status lm_st_read_i32(const lm_safetensors *st, const lm_st_tensor *t, int *out, size_t count);

typedef struct {
    const char *name;
    lm_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;          // numel · dtype size bytes
} lm_st_entry;

lm_status lm_st_write(const char *path, const lm_st_entry *e, int n, const char *const *meta_keys,
                      const char *const *meta_vals, int n_meta);

uint32_t lm_crc32(uint32_t crc, const void *data, size_t n);
// Writes `bytes` to path atomically (temp file, fsync, rename, fsync folder).
lm_status lm_write_file_atomic(const char *path, const void *bytes, size_t n);
// Reads a whole file; returns NULL with lm_last_error() set on failure.
uint8_t *lm_read_file(const char *path, size_t *size);

#endif
