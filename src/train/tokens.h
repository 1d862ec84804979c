// tokens.h — the token vocabulary shared by every data source and the model.
//
// Bytes 0–255 are themselves, so any text is a valid token sequence without a
// tokenizer. Above them sit a few special tokens the synthetic tasks need; the
// `tiny` preset's vocab (264) covers them with room for four more.
#ifndef LM_TOKENS_H
#define LM_TOKENS_H

enum {
    LM_TOK_BYTES = 256,   // ids 0..255: raw bytes
    LM_TOK_BOS = 256,     // begins every task example
    LM_TOK_EOS = 257,     // ends every task example (trained: the model learns to stop)
    LM_TOK_SEP = 258,     // separates a task's prompt from its answer
    LM_TOK_PAD = 259,     // fills the end of a packed row; never a target
    // 260..263 reserved
    LM_TOK_VOCAB = 264,   // vocab of the byte-level presets
    LM_TOK_MIN_VOCAB_TASKS = 260,   // smallest model vocab that can read task data (PAD is an input)
};

#endif
