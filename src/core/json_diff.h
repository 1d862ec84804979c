// json_diff.h — names the first top-level key whose value differs between two JSON
// objects, so a mismatch error can say which field (config, training options) differs.
#ifndef LM_JSON_DIFF_H
#define LM_JSON_DIFF_H
#include <stddef.h>

// Returns 1 and fills key / va / vb (values as JSON text) when the objects differ (a key
// missing on one side counts, shown as "(absent)"); 0 when equal.
int lm_json_first_diff(const char *a, const char *b, char *key, size_t key_len, char *va, char *vb, size_t val_len);

#endif
