// main.c — the `linmoe` command (placeholder until the CLI lands).
#include "core/common.h"
int main(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "linmoe: no commands yet\n");
    return 1;
}
