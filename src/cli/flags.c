// flags.c — see flags.h.
#include "cli/flags.h"
#include <ctype.h>
#include <errno.h>

static const lm_flag *find(const lm_flag *fl, int n, const char *arg) {
    if (arg[0] != '-') return NULL;
    if (arg[1] == '-') {
        for (int i = 0; i < n; i++)
            if (strcmp(fl[i].name, arg + 2) == 0) return &fl[i];
    } else if (arg[1] && !arg[2]) {
        for (int i = 0; i < n; i++)
            if (fl[i].alias && fl[i].alias == arg[1]) return &fl[i];
    }
    return NULL;
}

static lm_status set_value(const lm_flag *f, const char *v) {
    char *end;
    // strtol/strtoull/strtod skip leading blanks and strtoull takes " -1" as 2^64−1
    if (f->kind != FL_STR && f->kind != FL_LIST && isspace((unsigned char)*v)) {
        lm_set_error("--%s: unexpected blank before '%s'", f->name, v + strspn(v, " \t\n\r\f\v"));
        return LM_ERR;
    }
    errno = 0;
    switch (f->kind) {
    case FL_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || x != (int)x) { lm_set_error("--%s expects an integer, got '%s'", f->name, v); return LM_ERR; }
        *(int *)f->ptr = (int)x;
    } break;
    case FL_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || *v == '-' || errno == ERANGE) {
            lm_set_error("--%s expects a non-negative integer below 2^64, got '%s'", f->name, v);
            return LM_ERR;
        }
        *(uint64_t *)f->ptr = (uint64_t)x;
    } break;
    case FL_REAL: {
        double x = strtod(v, &end);
        if (!*v || *end || !isfinite(x) || !isfinite((real)x)) {   // 1e39 is finite as a double, not as a float
            lm_set_error("--%s expects a finite number, got '%s'", f->name, v);
            return LM_ERR;
        }
        *(real *)f->ptr = (real)x;
    } break;
    case FL_STR:
        if (strlen(v) >= f->size) { lm_set_error("--%s: value too long", f->name); return LM_ERR; }
        snprintf((char *)f->ptr, f->size, "%s", v);
        break;
    case FL_LIST: {
        lm_flag_list *l = f->ptr;
        if (l->n == LM_FLAG_LIST_MAX) { lm_set_error("--%s given too many times", f->name); return LM_ERR; }
        l->item[l->n++] = v;
    } break;
    case FL_BOOL: break;
    }
    return LM_OK;
}

lm_status lm_flags_parse(const lm_flag *fl, int n, int argc, char **argv, int first, int *help) {
    *help = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { *help = 1; continue; }
        char name[128];
        const char *eq = strchr(a, '=');
        const char *val = NULL;
        if (a[0] == '-' && a[1] == '-' && eq) {   // --flag=value
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
            a = name;
        }
        const lm_flag *f = find(fl, n, a);
        if (!f) {
            lm_set_error(argv[i][0] == '-' ? "unknown flag '%s' (see --help)" : "unexpected argument '%s' (see --help)", argv[i]);
            return LM_ERR;
        }
        if (f->kind == FL_BOOL) {
            if (val) { lm_set_error("--%s takes no value", f->name); return LM_ERR; }
            *(int *)f->ptr = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) { lm_set_error("--%s needs a value", f->name); return LM_ERR; }
            val = argv[++i];
        }
        if (set_value(f, val) != LM_OK) return LM_ERR;
    }
    return LM_OK;
}

void lm_flags_print_help(const lm_flag *fl, int n, FILE *f) {
    for (int i = 0; i < n; i++) {
        char left[64], def[160] = "";
        if (fl[i].alias) snprintf(left, sizeof left, "-%c, --%s", fl[i].alias, fl[i].name);
        else snprintf(left, sizeof left, "    --%s", fl[i].name);
        switch (fl[i].kind) {
        case FL_INT: snprintf(def, sizeof def, " (default %d)", *(int *)fl[i].ptr); break;
        case FL_U64: snprintf(def, sizeof def, " (default %llu)", (unsigned long long)*(uint64_t *)fl[i].ptr); break;
        case FL_REAL: snprintf(def, sizeof def, " (default %g)", (double)*(real *)fl[i].ptr); break;
        case FL_STR:
            // none for an empty value, or a sentinel below ' ' that a command resolves later
            if ((unsigned char)((char *)fl[i].ptr)[0] >= ' ') snprintf(def, sizeof def, " (default %s)", (char *)fl[i].ptr);
            break;
        case FL_BOOL: case FL_LIST: break;
        }
        fprintf(f, "  %-26s %s%s\n", left, fl[i].help, def);
    }
}

int lm_flags_run(const char *cmd, const char *usage, const lm_flag *fl, int n, int argc, char **argv) {
    int help;
    if (lm_flags_parse(fl, n, argc, argv, 2, &help) != LM_OK) {
        fprintf(stderr, "linmoe %s: error: %s\n", cmd, lm_last_error());
        return 1;
    }
    if (!help) return -1;
    printf("%s\n", usage);
    lm_flags_print_help(fl, n, stdout);
    return 0;
}
