// browser.h — test helpers that open a page in a real browser (Debian's headless
// Chromium) and read back what it produced: the serialised DOM after scripts ran, the
// console log, and a PNG screenshot decoded with libpng.
#ifndef LM_TEST_BROWSER_H
#define LM_TEST_BROWSER_H
#include <stddef.h>

// $LM_CHROMIUM if set, else the first of chromium, chromium-browser, google-chrome on
// PATH; NULL when there is none
const char *tb_chromium(void);

// Runs `chromium --headless <fixed flags> <extra...> <url>` with a fresh profile folder,
// stdout to out_path and stderr (where --enable-logging=stderr sends console messages)
// to err_path; kills it after timeout_s. Returns the exit status, or -1 on timeout or if
// it could not be started.
int tb_run_chromium(const char *chromium, const char *const *extra, int n_extra, const char *url,
                    const char *out_path, const char *err_path, int timeout_s);

// whole file as a NUL-terminated string; NULL if unreadable
char *tb_read_text(const char *path);

// 8-bit RGB pixels (row-major, 3 bytes each); NULL if the PNG cannot be decoded
unsigned char *tb_read_png_rgb(const char *path, int *width, int *height);

// rm -rf of a folder the test created
void tb_remove_tree(const char *path);

#endif
