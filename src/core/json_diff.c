// json_diff.c — see json_diff.h.
#include "core/json_diff.h"
#include "core/common.h"
#include <cjson/cJSON.h>

static int diff_one_way(const cJSON *x, const cJSON *y, char *key, size_t key_len, char *va, char *vb, size_t val_len) {
    for (const cJSON *i = x->child; i; i = i->next) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(y, i->string);
        char *si = cJSON_PrintUnformatted(i), *sj = j ? cJSON_PrintUnformatted(j) : lm_strdup("(absent)");
        int diff = strcmp(si, sj) != 0;
        if (diff) {
            snprintf(key, key_len, "%s", i->string);
            snprintf(va, val_len, "%s", si);
            snprintf(vb, val_len, "%s", sj);
        }
        free(si);
        free(sj);
        if (diff) return 1;
    }
    return 0;
}

int lm_json_first_diff(const char *a, const char *b, char *key, size_t key_len, char *va, char *vb, size_t val_len) {
    if (strcmp(a, b) == 0) return 0;
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    int d = 1;
    snprintf(key, key_len, "(not comparable)");
    va[0] = vb[0] = 0;
    if (x && y) d = diff_one_way(x, y, key, key_len, va, vb, val_len) || diff_one_way(y, x, key, key_len, vb, va, val_len);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return d;
}
