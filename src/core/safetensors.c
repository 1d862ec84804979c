// safetensors.c — see safetensors.h.
#include "core/safetensors.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *DTYPE_NAMES[] = {"F32", "F64", "I32", "BF16", "U8", "I64"};
static const size_t DTYPE_SIZE[] = {4, 8, 4, 2, 1, 8};
#define N_DTYPES 6

// ----------------------------------------------------------------------------
// CRC-32 (IEEE 802.3 polynomial, reflected), table built on first use

static uint32_t crc_table[256];
static int crc_ready;

uint32_t lm_crc32(uint32_t crc, const void *data, size_t n) {
    if (!crc_ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[i] = c;
        }
        crc_ready = 1;
    }
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

// ----------------------------------------------------------------------------
// files

uint8_t *lm_read_file(const char *path, size_t *size) {
    // a folder or FIFO where a file belongs: say so (fopen of a folder succeeds, and its
    // "size" is LONG_MAX; opening a FIFO would wait for a writer)
    struct stat ps;
    if (stat(path, &ps) == 0 && !S_ISREG(ps.st_mode)) {
        lm_set_error("'%s' is not a regular file%s", path, S_ISDIR(ps.st_mode) ? " (a folder)" : "");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) { lm_set_error("cannot open '%s': %s", path, strerror(errno)); return NULL; }
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); lm_set_error("cannot read '%s'", path); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); lm_set_error("cannot read '%s'", path); return NULL; }
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); lm_set_error("out of memory reading '%s'", path); return NULL; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        lm_set_error("cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *size = (size_t)n;
    return buf;
}

static lm_status fsync_dir_of(const char *path) {
    char *tmp = lm_strdup(path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY);
    free(tmp);
    if (fd < 0) return LM_OK;   // best effort: some filesystems do not allow it
    fsync(fd);
    close(fd);
    return LM_OK;
}

// Writes chunks to "<path>.tmp.<pid>", fsyncs, renames over path.
typedef struct { const void *p; size_t n; } chunk;

static lm_status write_chunks_atomic(const char *path, const chunk *ch, int nch) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        lm_set_error("path too long: '%s'", path);
        return LM_ERR;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { lm_set_error("cannot create '%s': %s", tmp, strerror(errno)); return LM_ERR; }
    for (int c = 0; c < nch; c++) {
        const uint8_t *p = ch[c].p;
        size_t left = ch[c].n;
        while (left > 0) {
            ssize_t w = write(fd, p, left > (1u << 30) ? (1u << 30) : left);
            if (w < 0) {
                if (errno == EINTR) continue;
                lm_set_error("cannot write '%s': %s", tmp, strerror(errno));
                close(fd);
                unlink(tmp);
                return LM_ERR;
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        lm_set_error("cannot flush '%s': %s", tmp, strerror(errno));
        unlink(tmp);
        return LM_ERR;
    }
    if (rename(tmp, path) != 0) {
        lm_set_error("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        unlink(tmp);
        return LM_ERR;
    }
    return fsync_dir_of(path);
}

lm_status lm_write_file_atomic(const char *path, const void *bytes, size_t n) {
    chunk c = {bytes, n};
    return write_chunks_atomic(path, &c, 1);
}

// ----------------------------------------------------------------------------
// writer

lm_status lm_st_write(const char *path, const lm_st_entry *e, int n, const char *const *meta_keys,
                      const char *const *meta_vals, int n_meta) {
    cJSON *hdr = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
    for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(meta, meta_keys[i], meta_vals[i]);
    size_t off = 0;
    uint32_t crc = 0;
    size_t *sizes = lm_malloc((size_t)(n ? n : 1) * sizeof(size_t));
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) numel *= (size_t)e[i].shape[d];
        sizes[i] = numel * DTYPE_SIZE[e[i].dtype];
        cJSON *t = cJSON_AddObjectToObject(hdr, e[i].name);
        cJSON_AddStringToObject(t, "dtype", DTYPE_NAMES[e[i].dtype]);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + sizes[i])));
        off += sizes[i];
        crc = lm_crc32(crc, e[i].data, sizes[i]);
    }
    char crc_hex[16];
    snprintf(crc_hex, sizeof crc_hex, "%08x", crc);
    cJSON_AddStringToObject(meta, "linmoe_crc32", crc_hex);
    char *js = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;   // 8-byte aligned data section
    char *hbuf = lm_malloc(8 + padded);
    uint64_t hl = padded;
    for (int b = 0; b < 8; b++) hbuf[b] = (char)((hl >> (8 * b)) & 0xff);
    memcpy(hbuf + 8, js, jl);
    memset(hbuf + 8 + jl, ' ', padded - jl);
    free(js);
    int nch = n + 1;
    chunk *ch = lm_malloc((size_t)nch * sizeof(chunk));
    ch[0] = (chunk){hbuf, 8 + padded};
    for (int i = 0; i < n; i++) ch[i + 1] = (chunk){e[i].data, sizes[i]};
    lm_status st = write_chunks_atomic(path, ch, nch);
    free(ch);
    free(hbuf);
    free(sizes);
    return st;
}

// ----------------------------------------------------------------------------
// reader

void lm_st_close(lm_safetensors *st) {
    for (int i = 0; i < st->n_meta; i++) { free(st->meta_keys[i]); free(st->meta_vals[i]); }
    free(st->meta_keys);
    free(st->meta_vals);
    free(st->t);
    free(st->file);
    memset(st, 0, sizeof *st);
}

static int cmp_begin(const void *a, const void *b) {
    const lm_st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

#define FAIL(...) do { lm_set_error(__VA_ARGS__); goto fail; } while (0)

lm_status lm_st_open(lm_safetensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    cJSON *hdr = NULL;
    lm_st_tensor *sorted = NULL;
    st->file = lm_read_file(path, &st->file_size);
    if (!st->file) return LM_ERR;
    if (st->file_size < 8) FAIL("'%s' is not a safetensors file (truncated: %zu bytes)", path, st->file_size);
    uint64_t hl = 0;
    for (int b = 0; b < 8; b++) hl |= (uint64_t)st->file[b] << (8 * b);
    if (hl < 2 || hl > st->file_size - 8) FAIL("'%s' is corrupt or truncated (header length %llu, file %zu bytes)", path,
                                              (unsigned long long)hl, st->file_size);
    hdr = cJSON_ParseWithLength((const char *)st->file + 8, (size_t)hl);
    if (!hdr || !cJSON_IsObject(hdr)) FAIL("'%s' is corrupt: the header is not a JSON object", path);
    st->data = st->file + 8 + hl;
    st->data_size = st->file_size - 8 - (size_t)hl;
    int cap = cJSON_GetArraySize(hdr);
    st->t = lm_malloc((size_t)(cap ? cap : 1) * sizeof(lm_st_tensor));
    for (cJSON *it = hdr->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) FAIL("'%s' is corrupt: __metadata__ is not an object", path);
            int nm = cJSON_GetArraySize(it);
            st->meta_keys = lm_malloc((size_t)(nm ? nm : 1) * sizeof(char *));
            st->meta_vals = lm_malloc((size_t)(nm ? nm : 1) * sizeof(char *));
            for (cJSON *m = it->child; m; m = m->next) {
                if (!cJSON_IsString(m)) FAIL("'%s' is corrupt: metadata '%s' is not a string", path, m->string);
                st->meta_keys[st->n_meta] = lm_strdup(m->string);
                st->meta_vals[st->n_meta++] = lm_strdup(m->valuestring);
            }
            continue;
        }
        lm_st_tensor *t = &st->t[st->n];
        if (strlen(it->string) >= sizeof t->name) FAIL("'%s': tensor name too long: %s", path, it->string);
        snprintf(t->name, sizeof t->name, "%s", it->string);
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
            FAIL("'%s' is corrupt: tensor '%s' lacks dtype/shape/data_offsets", path, t->name);
        int k = -1;
        for (int d = 0; d < N_DTYPES; d++)
            if (strcmp(dt->valuestring, DTYPE_NAMES[d]) == 0) k = d;
        if (k < 0) FAIL("'%s': tensor '%s' has unsupported dtype %s", path, t->name, dt->valuestring);
        t->dtype = (lm_st_dtype)k;
        t->ndim = cJSON_GetArraySize(sh);
        if (t->ndim > 8) FAIL("'%s': tensor '%s' has %d dimensions (max 8)", path, t->name, t->ndim);
        t->numel = 1;
        int d = 0;
        for (cJSON *s = sh->child; s; s = s->next, d++) {
            if (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble != (double)(int64_t)s->valuedouble)
                FAIL("'%s' is corrupt: tensor '%s' has a bad shape", path, t->name);
            t->shape[d] = (int64_t)s->valuedouble;
            t->numel *= (size_t)t->shape[d];
        }
        cJSON *b = of->child, *e = b->next;
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) || b->valuedouble < 0 || e->valuedouble < b->valuedouble)
            FAIL("'%s' is corrupt: tensor '%s' has bad data_offsets", path, t->name);
        t->begin = (size_t)b->valuedouble;
        t->end = (size_t)e->valuedouble;
        if (t->end - t->begin != t->numel * DTYPE_SIZE[t->dtype])
            FAIL("'%s' is corrupt: tensor '%s' has %zu bytes for %zu elements", path, t->name, t->end - t->begin,
                 t->numel);
        if (t->end > st->data_size)
            FAIL("'%s' is truncated: tensor '%s' ends at byte %zu of a %zu-byte data section", path, t->name, t->end,
                 st->data_size);
        st->n++;
    }
    // tensors must not overlap
    sorted = lm_malloc((size_t)(st->n ? st->n : 1) * sizeof *sorted);
    memcpy(sorted, st->t, (size_t)st->n * sizeof *sorted);
    qsort(sorted, (size_t)st->n, sizeof *sorted, cmp_begin);
    for (int i = 1; i < st->n; i++)
        if (sorted[i].begin < sorted[i - 1].end)
            FAIL("'%s' is corrupt: tensors '%s' and '%s' overlap", path, sorted[i - 1].name, sorted[i].name);
    const char *crc = lm_st_meta(st, "linmoe_crc32");
    if (crc) {
        size_t used = st->n ? sorted[st->n - 1].end : 0;
        if (used != st->data_size) FAIL("'%s' is corrupt: %zu data bytes but tensors cover %zu", path, st->data_size, used);
        char want[16];
        snprintf(want, sizeof want, "%08x", lm_crc32(0, st->data, st->data_size));
        if (strcmp(want, crc) != 0)
            FAIL("'%s' is corrupt: checksum mismatch (stored %s, computed %s)", path, crc, want);
    }
    free(sorted);
    cJSON_Delete(hdr);
    return LM_OK;
fail:
    free(sorted);
    cJSON_Delete(hdr);
    lm_st_close(st);
    return LM_ERR;
}

const lm_st_tensor *lm_st_find(const lm_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

const char *lm_st_meta(const lm_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_vals[i];
    return NULL;
}

lm_status lm_st_read_real(const lm_safetensors *st, const lm_st_tensor *t, real *out, size_t count) {
    if (t->numel != count) {
        lm_set_error("tensor '%s' has %zu elements, expected %zu", t->name, t->numel, count);
        return LM_ERR;
    }
    const uint8_t *p = st->data + t->begin;
    for (size_t i = 0; i < count; i++) {
        switch (t->dtype) {
        case LM_ST_F32: { float v; memcpy(&v, p + 4 * i, 4); out[i] = (real)v; } break;
        case LM_ST_F64: { double v; memcpy(&v, p + 8 * i, 8); out[i] = (real)v; } break;
        case LM_ST_BF16: {
            uint32_t u = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
            u <<= 16;
            float v;
            memcpy(&v, &u, 4);
            out[i] = (real)v;
        } break;
        default: lm_set_error("tensor '%s' is not floating point", t->name); return LM_ERR;
        }
    }
    return LM_OK;
}

lm_status lm_st_read_i32(const lm_safetensors *st, const lm_st_tensor *t, int *out, size_t count) {
    if (t->numel != count || t->dtype != LM_ST_I32) {
        lm_set_error("tensor '%s' is not I32 with %zu elements", t->name, count);
        return LM_ERR;
    }
    memcpy(out, st->data + t->begin, count * 4);
    return LM_OK;
}
