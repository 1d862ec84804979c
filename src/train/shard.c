// shard.c — the uint32 token-shard format (see text.h): loading with validation, and
// a streaming writer.
#include "train/text.h"
#include "core/safetensors.h"   // lm_crc32
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <unistd.h>

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le64(uint8_t *p, uint64_t v) {
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

// Validates one mapped shard; on success sets f->tok, f->n and the shard's vocab.
static lm_status check_shard(lm_data_file *f, int model_vocab, uint32_t *vocab) {
    const char *p = f->path;
    const uint8_t *m = f->map;
    if (f->map_size < LM_SHARD_HEADER) {
        lm_set_error("shard '%s': %zu bytes is too short for the %d-byte header (truncated?)", p, f->map_size,
                     LM_SHARD_HEADER);
        return LM_ERR;
    }
    if (memcmp(m, LM_SHARD_MAGIC, 4) != 0) {
        lm_set_error("shard '%s': bad magic (expected \"%s\"): not a linmoe token shard", p, LM_SHARD_MAGIC);
        return LM_ERR;
    }
    uint32_t version = le32(m + 4), v = le32(m + 8);
    uint64_t n = le64(m + 12);
    if (version != LM_SHARD_VERSION) {
        lm_set_error("shard '%s': unsupported format version %u (this build reads version %d)", p, version,
                     LM_SHARD_VERSION);
        return LM_ERR;
    }
    if (v == 0 || (uint64_t)v > (uint64_t)model_vocab) {
        lm_set_error("shard '%s': vocab %u does not fit the model's vocab %d", p, v, model_vocab);
        return LM_ERR;
    }
    if (n > (SIZE_MAX - LM_SHARD_HEADER) / 4 || f->map_size != LM_SHARD_HEADER + 4 * n) {
        lm_set_error("shard '%s': file size %zu bytes does not match its header (%d + 4 x %llu tokens = %.0f bytes): "
                     "truncated or corrupt", p, f->map_size, LM_SHARD_HEADER, (unsigned long long)n,
                     LM_SHARD_HEADER + 4.0 * (double)n);
        return LM_ERR;
    }
    if (n == 0) { lm_set_error("shard '%s' holds no tokens", p); return LM_ERR; }
    const uint8_t *t = m + LM_SHARD_HEADER;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = le32(t + 4 * i);
        if (id >= v) {
            lm_set_error("shard '%s': token %u at index %llu is out of range (vocab %u)", p, id,
                         (unsigned long long)i, v);
            return LM_ERR;
        }
    }
    f->tok = t;
    f->n = n;
    *vocab = v;
    return LM_OK;
}

lm_status lm_shards_open(lm_token_data **out, const char *const *paths, int n, int model_vocab) {
    *out = NULL;
    if (n <= 0) { lm_set_error("no shard files given"); return LM_ERR; }
    lm_token_data *d = lm_malloc(sizeof *d);
    d->format = LM_DATA_SHARD_U32;
    d->refs = 1;
    d->files = lm_malloc((size_t)n * sizeof *d->files);
    for (int i = 0; i < n; i++) {
        lm_data_file *f = &d->files[i];
        uint32_t v = 0;
        if (lm_data_map(f, paths[i], "shard") != LM_OK) goto fail;
        d->n_files = i + 1;   // from here on, released with the rest
        if (check_shard(f, model_vocab, &v) != LM_OK) goto fail;
        f->first = d->n_tokens;
        d->n_tokens += f->n;
        if (v > d->vocab) d->vocab = v;
        d->crc = lm_crc32(d->crc, f->tok, 4 * f->n);
    }
    if (n == 1) snprintf(d->name, sizeof d->name, "shard '%s'", paths[0]);
    else snprintf(d->name, sizeof d->name, "shards '%s' ... '%s' (%d files)", paths[0], paths[n - 1], n);
    *out = d;
    return LM_OK;
fail:
    lm_token_data_release(d);
    return LM_ERR;
}

// ----------------------------------------------------------------------------
// writer

static void write_header(uint8_t h[LM_SHARD_HEADER], uint32_t vocab, uint64_t n) {
    memcpy(h, LM_SHARD_MAGIC, 4);
    put_le32(h + 4, LM_SHARD_VERSION);
    put_le32(h + 8, vocab);
    put_le64(h + 12, n);
}

static void writer_discard(lm_shard_writer *w) {
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}

lm_status lm_shard_writer_open(lm_shard_writer *w, const char *path, uint32_t vocab) {
    memset(w, 0, sizeof *w);
    if (vocab == 0) { lm_set_error("shard '%s': vocab must be positive", path); return LM_ERR; }
    size_t n = strlen(path) + 32;
    w->path = lm_strdup(path);
    w->tmp = lm_malloc(n);
    snprintf(w->tmp, n, "%s.tmp.%d", path, (int)getpid());
    w->vocab = vocab;
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        lm_set_error("cannot create '%s': %s", w->tmp, strerror(errno));
        free(w->tmp);
        w->tmp = NULL;   // nothing to remove
        writer_discard(w);
        return LM_ERR;
    }
    uint8_t h[LM_SHARD_HEADER];
    write_header(h, vocab, 0);   // the count is filled in by close()
    if (fwrite(h, 1, sizeof h, w->f) != sizeof h) {
        lm_set_error("cannot write '%s': %s", w->tmp, strerror(errno));
        writer_discard(w);
        return LM_ERR;
    }
    return LM_OK;
}

lm_status lm_shard_writer_append(lm_shard_writer *w, const uint32_t *tokens, size_t n) {
    if (w->failed || !w->f) { lm_set_error("shard writer for '%s' has already failed", w->path ? w->path : "?"); return LM_ERR; }
    uint8_t buf[4096];
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < sizeof buf / 4 && i < n; k++, i++) {
            if (tokens[i] >= w->vocab) {
                lm_set_error("shard '%s': token %u at index %llu is out of range (vocab %u)", w->path, tokens[i],
                             (unsigned long long)(w->n + i), w->vocab);
                w->failed = 1;
                return LM_ERR;
            }
            put_le32(buf + 4 * k, tokens[i]);
        }
        if (fwrite(buf, 4, k, w->f) != k) {
            lm_set_error("cannot write '%s': %s", w->tmp, strerror(errno));
            w->failed = 1;
            return LM_ERR;
        }
    }
    w->n += n;
    return LM_OK;
}

lm_status lm_shard_writer_close(lm_shard_writer *w) {
    if (w->failed || !w->f) {
        if (!w->f) lm_set_error("shard writer is not open");
        writer_discard(w);
        return LM_ERR;
    }
    uint8_t h[LM_SHARD_HEADER];
    write_header(h, w->vocab, w->n);
    if (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->f) != sizeof h || fflush(w->f) != 0 ||
        fsync(fileno(w->f)) != 0) {
        lm_set_error("cannot write '%s': %s", w->tmp, strerror(errno));
        writer_discard(w);
        return LM_ERR;
    }
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0 || rename(w->tmp, w->path) != 0) {
        lm_set_error("cannot finish '%s': %s", w->path, strerror(errno));
        writer_discard(w);
        return LM_ERR;
    }
    // make the rename durable (best effort: some filesystems refuse to open folders)
    char *dir = lm_strdup(w->path);
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    free(dir);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(w->tmp);
    w->tmp = NULL;   // renamed: nothing to remove
    writer_discard(w);
    return LM_OK;
}

lm_status lm_shard_write(const char *path, const uint32_t *tokens, size_t n, uint32_t vocab) {
    lm_shard_writer w;
    if (lm_shard_writer_open(&w, path, vocab) != LM_OK) return LM_ERR;
    if (lm_shard_writer_append(&w, tokens, n) != LM_OK) {
        writer_discard(&w);
        return LM_ERR;
    }
    return lm_shard_writer_close(&w);
}
