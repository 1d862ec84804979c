// batch.h — one training batch as every data source delivers it.
//
// tokens[b,t] is the input at position t of row b; targets[b,t] is the token the
// model must predict there (the input at t+1), or −1 where nothing is trained.
// Text and shards count every target; task data counts only answers (see tasks.h),
// and also lists its examples so evaluation can score each one.
#ifndef LM_BATCH_H
#define LM_BATCH_H
#include <stddef.h>

// One task example inside a packed row. Positions are row-relative.
typedef struct {
    int row;        // 0..B-1
    int start;      // position of its BOS
    int len;        // tokens BOS..EOS; start+len-1 may equal T (then its EOS is only a target)
    int tgt_start;  // first counted target (the SEP position: its target is the first answer byte)
    int n_tgt;      // counted targets: answer bytes + the final EOS; they occupy
                    // targets[row, tgt_start .. tgt_start+n_tgt)
    int task;       // lm_task_id (tasks.h)
} lm_example;

typedef struct {
    int B, T;
    int *tokens;        // [B, T]
    int *targets;       // [B, T], −1 = not counted
    lm_example *ex;     // [n_ex], ordered by row then position; empty for text/shards
    int n_ex;
    size_t cap_tok;     // allocated elements of tokens/targets
    int cap_ex;         // allocated examples
} lm_batch;

// Makes room for B rows of T tokens (keeps the allocation when large enough) and
// sets B, T, n_ex = 0.
void lm_batch_reserve(lm_batch *b, int B, int T);
// Appends an example, growing the list as needed.
void lm_batch_add_example(lm_batch *b, lm_example e);
void lm_batch_free(lm_batch *b);

#endif
