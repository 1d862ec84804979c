// flags.h — long flags with short aliases, parsed from a table; --help is generated
// from the same table and shows every flag with its current (default) value.
#ifndef LM_FLAGS_H
#define LM_FLAGS_H
#include "core/common.h"

typedef enum { FL_INT, FL_REAL, FL_STR, FL_BOOL, FL_U64, FL_LIST } lm_flag_kind;

#define LM_FLAG_LIST_MAX 64
typedef struct { const char *item[LM_FLAG_LIST_MAX]; int n; } lm_flag_list;   // repeated flag values

typedef struct {
    const char *name;     // without the leading "--"
    char alias;           // short alias letter, 0 = none
    lm_flag_kind kind;
    void *ptr;            // int*, real*, char[size], int* (bool), uint64_t*, lm_flag_list*
    size_t size;          // FL_STR buffer size
    const char *help;
} lm_flag;

// Parses argv[first..argc). Returns LM_ERR with a one-line message for an unknown flag,
// a missing or malformed value, or a stray argument. Sets *help when --help/-h is given.
lm_status lm_flags_parse(const lm_flag *fl, int n, int argc, char **argv, int first, int *help);
void lm_flags_print_help(const lm_flag *fl, int n, FILE *f);
// Parses the flags of subcommand `cmd` (argv[2..]). On a bad flag prints one error line
// and returns 1; on --help prints `usage` and the flag table and returns 0; otherwise
// returns −1 (go on).
int lm_flags_run(const char *cmd, const char *usage, const lm_flag *fl, int n, int argc, char **argv);

#endif
