// browser.c — see browser.h.
#include "browser.h"
#include "core/common.h"
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <png.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int executable(const char *path) { return access(path, X_OK) == 0; }

const char *tb_chromium(void) {
    static char found[4096];
    const char *env = getenv("LM_CHROMIUM");
    if (env && env[0]) return executable(env) ? env : NULL;
    static const char *const names[] = {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"};
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const char *p = path;
        while (*p) {
            size_t len = strcspn(p, ":");
            snprintf(found, sizeof found, "%.*s/%s", (int)len, p, names[n]);
            if (len && executable(found)) return found;
            p += len + (p[len] == ':');
        }
    }
    return NULL;
}

int tb_run_chromium(const char *chromium, const char *const *extra, int n_extra, const char *url,
                    const char *out_path, const char *err_path, int timeout_s) {
    // a fresh profile per run: no state (crash reports, caches) leaks between runs
    char profile[] = "/tmp/lm_chromium_profile_XXXXXX";
    if (!mkdtemp(profile)) return -1;
    char profile_flag[sizeof profile + 32];
    snprintf(profile_flag, sizeof profile_flag, "--user-data-dir=%s", profile);
    const char *fixed[] = {"--headless",   "--no-sandbox",         "--disable-gpu",
                           "--disable-quic", "--no-first-run",     "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
                           "--v=0",        "--hide-scrollbars",    "--force-device-scale-factor=1",
                           profile_flag};
    int nf = (int)(sizeof fixed / sizeof fixed[0]);
    const char **argv = calloc((size_t)(nf + n_extra + 3), sizeof(char *));
    int a = 0;
    argv[a++] = chromium;
    for (int i = 0; i < nf; i++) argv[a++] = fixed[i];
    for (int i = 0; i < n_extra; i++) argv[a++] = extra[i];
    argv[a++] = url;
    argv[a] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);   // its own process group, so a timeout can end all its helpers
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (out < 0 || err < 0 || in < 0) _exit(127);
        dup2(in, 0), dup2(out, 1), dup2(err, 2);
        execvp(chromium, (char *const *)argv);
        _exit(127);
    }
    free(argv);
    int status = -1, rc = -1;
    if (pid > 0) {
        setpgid(pid, pid);
        double t0 = lm_time_sec();
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                break;
            }
            if (w < 0 && errno != EINTR) break;
            if (lm_time_sec() - t0 > timeout_s) {
                fprintf(stderr, "chromium did not finish within %d s; stopping it\n", timeout_s);
                kill(-pid, SIGKILL);
                waitpid(pid, &status, 0);
                break;
            }
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
    }
    tb_remove_tree(profile);
    return rc;
}

char *tb_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    size_t r;
    while ((r = fread(s + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) s = realloc(s, cap *= 2);
    }
    fclose(f);
    s[n] = 0;
    return s;
}

unsigned char *tb_read_png_rgb(const char *path, int *width, int *height) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGB;
    unsigned char *px = malloc(PNG_IMAGE_SIZE(img));
    if (!px || !png_image_finish_read(&img, NULL, px, 0, NULL)) {
        png_image_free(&img);
        free(px);
        return NULL;
    }
    *width = (int)img.width;
    *height = (int)img.height;
    return px;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void tb_remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
