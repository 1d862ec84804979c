// text.c — the mapped token stream: text files, shared ownership, and reading rows
// of consecutive windows (see text.h). Shard files are validated in shard.c.
#include "train/text.h"
#include "core/safetensors.h"   // lm_crc32
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

lm_status lm_data_map(lm_data_file *f, const char *path, const char *what) {
    memset(f, 0, sizeof *f);
    struct stat ps;   // before open(): opening a FIFO would wait for a writer
    if (stat(path, &ps) == 0 && !S_ISREG(ps.st_mode)) {
        lm_set_error("%s '%s' is not a regular file", what, path);
        return LM_ERR;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) { lm_set_error("cannot open %s '%s': %s", what, path, strerror(errno)); return LM_ERR; }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        lm_set_error("%s '%s' is not a regular file", what, path);
        close(fd);
        return LM_ERR;
    }
    f->path = lm_strdup(path);
    f->map_size = (size_t)st.st_size;
    if (f->map_size > 0) {   // an empty file cannot be mapped; callers report it
        f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            lm_set_error("cannot map %s '%s': %s", what, path, strerror(errno));
            f->map = NULL;
            close(fd);
            lm_data_unmap(f);
            return LM_ERR;
        }
    }
    close(fd);   // the mapping stays valid
    return LM_OK;
}

void lm_data_unmap(lm_data_file *f) {
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

lm_status lm_text_open(lm_token_data **out, const char *path, int model_vocab) {
    *out = NULL;
    if (model_vocab < 256) {
        lm_set_error("text file '%s' is read as bytes, which needs a model vocab of at least 256 (model has %d)", path,
                     model_vocab);
        return LM_ERR;
    }
    lm_data_file f;
    if (lm_data_map(&f, path, "text file") != LM_OK) return LM_ERR;
    if (f.map_size == 0) {
        lm_set_error("text file '%s' is empty", path);
        lm_data_unmap(&f);
        return LM_ERR;
    }
    lm_token_data *d = lm_malloc(sizeof *d);
    d->format = LM_DATA_TEXT_BYTES;
    snprintf(d->name, sizeof d->name, "text file '%s'", path);
    d->files = lm_malloc(sizeof *d->files);
    d->files[0] = f;
    d->files[0].tok = f.map;
    d->files[0].n = f.map_size;
    d->n_files = 1;
    d->n_tokens = f.map_size;
    d->vocab = 256;
    d->crc = lm_crc32(0, f.map, f.map_size);
    d->refs = 1;
    *out = d;
    return LM_OK;
}

void lm_token_data_retain(lm_token_data *d) { d->refs++; }

void lm_token_data_release(lm_token_data *d) {
    if (!d || --d->refs > 0) return;
    for (int i = 0; i < d->n_files; i++) lm_data_unmap(&d->files[i]);
    free(d->files);
    free(d);
}

// ----------------------------------------------------------------------------
// reading

void lm_token_copy(const lm_token_data *d, uint64_t g, uint64_t k, int *dst) {
    LM_ASSERT(g + k <= d->n_tokens);
    // the file holding token g: the last one whose first token is ≤ g
    int lo = 0, hi = d->n_files - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->files[mid].first <= g) lo = mid; else hi = mid - 1;
    }
    for (int f = lo; k > 0; f++) {
        LM_ASSERT(f < d->n_files);
        const lm_data_file *F = &d->files[f];
        uint64_t off = g - F->first, take = F->n - off < k ? F->n - off : k;
        if (d->format == LM_DATA_TEXT_BYTES) {
            for (uint64_t i = 0; i < take; i++) dst[i] = F->tok[off + i];
        } else {
            const uint8_t *p = F->tok + 4 * off;
            for (uint64_t i = 0; i < take; i++, p += 4)
                dst[i] = (int)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        }
        dst += take, g += take, k -= take;
    }
}

void lm_token_reader_init(lm_token_reader *r, lm_token_data *d, int heldout) {
    memset(r, 0, sizeof *r);
    lm_token_data_retain(d);
    r->data = d;
    r->heldout = heldout;
    uint64_t split = d->n_tokens - lm_heldout_tokens(d->n_tokens);
    r->lo = heldout ? split : 0;
    r->hi = heldout ? d->n_tokens : split;
}

void lm_token_reader_free(lm_token_reader *r) {
    lm_token_data_release(r->data);
    free(r->window);
    memset(r, 0, sizeof *r);
}

lm_status lm_token_batch(lm_token_reader *r, int B, int T, lm_batch *out) {
    if (B <= 0 || T <= 0) { lm_set_error("batch shape must be positive, got B=%d T=%d", B, T); return LM_ERR; }
    const lm_token_data *d = r->data;
    uint64_t len = r->hi - r->lo, need = (uint64_t)T + 1;
    if (d->n_tokens < need) {
        lm_set_error("%s has %llu tokens, fewer than one row needs (T+1 = %d)", d->name,
                     (unsigned long long)d->n_tokens, T + 1);
        return LM_ERR;
    }
    if (len < need) {
        lm_set_error("%s: its %s (%llu of %llu tokens) is shorter than one row (T+1 = %d)", d->name,
                     r->heldout ? "held-out part (the last 5%)" : "training part (all but the last 5%)",
                     (unsigned long long)len, (unsigned long long)d->n_tokens, T + 1);
        return LM_ERR;
    }
    if (r->window_cap < T + 1) {
        free(r->window);
        r->window = lm_malloc((size_t)(T + 1) * sizeof(int));
        r->window_cap = T + 1;
    }
    lm_batch_reserve(out, B, T);
    for (int b = 0; b < B; b++) {
        // T+1 tokens from start, wrapping inside the region
        uint64_t start = (r->pos + (uint64_t)b * T) % len;
        uint64_t first = len - start < need ? len - start : need;
        lm_token_copy(d, r->lo + start, first, r->window);
        if (first < need) lm_token_copy(d, r->lo, need - first, r->window + first);
        memcpy(out->tokens + (size_t)b * T, r->window, (size_t)T * sizeof(int));
        memcpy(out->targets + (size_t)b * T, r->window + 1, (size_t)T * sizeof(int));
    }
    r->pos = (r->pos + (uint64_t)B * T) % len;
    r->n_batches++;
    return LM_OK;
}
