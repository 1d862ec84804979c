// text.h — user data: a text file read byte by byte, or uint32 token shards.
//
// Both become one read-only token stream (files are memory-mapped, not copied), read
// in rows of consecutive windows: row b of a batch holds the T+1 tokens starting at
// pos + b·T, so neighbouring rows overlap by one token, every token of the stream is a
// target exactly once per pass, and every target is counted. After a batch pos moves
// on by B·T; at the end of the region the window wraps to its start.
//
// Held-out split: the last 5% of the stream (⌊n/20⌋ tokens; for shards, of all files
// concatenated in the order given) is the held-out region and the training reader never
// reads it, not even across the wrap. The training region is the first n − ⌊n/20⌋.
//
// Token-shard format (little-endian):
//   offset 0   "LMTS"              magic
//   offset 4   uint32 version      1
//   offset 8   uint32 vocab        every token id is < vocab
//   offset 12  uint64 n_tokens
//   offset 20  uint32 token[n_tokens]
// and nothing after. Loading checks each of these; the vocab must also be ≤ the model's.
#ifndef LM_TEXT_H
#define LM_TEXT_H
#include "core/common.h"
#include "train/batch.h"

#define LM_SHARD_MAGIC "LMTS"
#define LM_SHARD_VERSION 1
#define LM_SHARD_HEADER 20

typedef enum { LM_DATA_TEXT_BYTES = 1, LM_DATA_SHARD_U32 = 2 } lm_data_format;

typedef struct {
    char *path;
    void *map;             // the mapped file
    size_t map_size;
    const uint8_t *tok;    // first token: bytes (text) or little-endian uint32 (shards)
    uint64_t n;            // tokens in this file
    uint64_t first;        // index of its first token in the whole stream
} lm_data_file;

typedef struct {
    lm_data_format format;
    char name[160];        // for messages: "text file 'x'", "shards 'a' … (3 files)"
    lm_data_file *files;
    int n_files;
    uint64_t n_tokens;     // all files
    uint32_t vocab;        // 256 for text; the largest shard vocab
    uint32_t crc;          // CRC-32 of all token bytes: identifies the data in a saved state
    int refs;              // readers sharing it (train + held-out)
} lm_token_data;

// Opens and maps a text file (byte tokens). LM_ERR when it cannot be read, is empty, or
// the model's vocab is below 256.
lm_status lm_text_open(lm_token_data **out, const char *path, int model_vocab);
// Opens, maps and validates n shard files (magic, version, size, vocab ≤ model_vocab,
// every token < the shard's vocab). LM_ERR naming the file and the problem.
lm_status lm_shards_open(lm_token_data **out, const char *const *paths, int n, int model_vocab);
void lm_token_data_retain(lm_token_data *d);
void lm_token_data_release(lm_token_data *d);   // unmaps and frees at the last release

// The held-out size of a stream of n tokens (the rest is for training).
static inline uint64_t lm_heldout_tokens(uint64_t n) { return n / 20; }

// ----------------------------------------------------------------------------
// reading windows

typedef struct {
    lm_token_data *data;   // retained by the reader
    int heldout;           // 0: the training region, 1: the held-out region
    uint64_t lo, hi;       // region [lo, hi) of the stream
    uint64_t pos;          // next row starts at lo + pos; with n_batches, the whole state
    uint64_t n_batches;
    int *window;           // scratch [T+1]
    int window_cap;
} lm_token_reader;

void lm_token_reader_init(lm_token_reader *r, lm_token_data *d, int heldout);
void lm_token_reader_free(lm_token_reader *r);
// Fills B rows of T tokens (targets = next tokens, all counted; no examples).
// LM_ERR when the region is shorter than T+1 tokens.
lm_status lm_token_batch(lm_token_reader *r, int B, int T, lm_batch *out);
// Copies tokens [g, g+k) of the stream into dst[k].
void lm_token_copy(const lm_token_data *d, uint64_t g, uint64_t k, int *dst);

// ----------------------------------------------------------------------------
// writing shards: stream tokens into "<path>.tmp.<pid>", then close() fills in the
// count, fsyncs and renames over path (a crash leaves no half-written shard at path).

typedef struct {
    FILE *f;
    char *path, *tmp;
    uint32_t vocab;
    uint64_t n;
    int failed;
} lm_shard_writer;

lm_status lm_shard_writer_open(lm_shard_writer *w, const char *path, uint32_t vocab);
// LM_ERR (and the writer is failed) when a token is ≥ vocab or the write fails.
lm_status lm_shard_writer_append(lm_shard_writer *w, const uint32_t *tokens, size_t n);
// Finishes the file; on a failed writer removes the temporary file and returns LM_ERR.
lm_status lm_shard_writer_close(lm_shard_writer *w);
// The whole thing in one call.
lm_status lm_shard_write(const char *path, const uint32_t *tokens, size_t n, uint32_t vocab);

// internal, shared by text.c and shard.c: maps a whole file read-only
lm_status lm_data_map(lm_data_file *f, const char *path, const char *what);
void lm_data_unmap(lm_data_file *f);

#endif
