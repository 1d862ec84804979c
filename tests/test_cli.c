// test_cli.c — the `linmoe` program end to end: same seed ⇒ same run bit for bit;
// 10 steps + resume 10 ⇒ the 20-step run bit for bit; non-finite steps are skipped;
// a kill -9 in the middle of a save leaves the previous checkpoint usable; and every
// kind of bad input gets one clear error line, a non-zero exit, and leaves the files
// on disk untouched; `linmoe ablate` runs a study end to end.
#include "harness.h"
#include "core/safetensors.h"
#include "train/text.h"
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[512], dir[512];

// a small hybrid model (KDA, MLA, MoE, block AttnRes) so each run takes a second or two
static const char *MODEL =
    "--set d_model=32 --set n_layers=3 --set layer_types=KMK --set kda_heads=2 --set kda_head_dim=16 "
    "--set mla_heads=2 --set kv_lora_rank=16 --set qk_nope_dim=8 --set qk_extra_dim=4 --set v_head_dim=8 "
    "--set d_ff_dense=64 --set n_experts=4 --set top_k=2 --set d_ff_expert=16 --set block_layers=2";
static const char *TRAIN = "--steps 20 --batch 2 --seq 64 --eval-every 0 --save-every 10 --keep 5 --samples 0 -q -t 2";

typedef struct { int status, signal; char err[4096]; } result;

// Runs `linmoe <args>` through the shell; captures stderr.
static result run(const char *env, const char *args) {
    result r = {0};
    char cmd[4096], errf[600];
    snprintf(errf, sizeof errf, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s %s > /dev/null 2> %s", env ? env : "", bin, args, errf);
    int st = system(cmd);
    if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    // the shell reports a killed child as 128 + signal
    if (r.status > 128) r.signal = r.status - 128;
    FILE *f = fopen(errf, "r");
    if (f) {
        size_t n = fread(r.err, 1, sizeof r.err - 1, f);
        r.err[n] = 0;
        fclose(f);
    }
    return r;
}

static uint8_t *slurp(const char *path, size_t *n) {
    uint8_t *b = lm_read_file(path, n);
    assert_non_null(b);
    return b;
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// The "loss" values of the train lines of a metrics file, as text (bit-exact compare).
static void losses(const char *path, char *out, size_t n) {
    size_t len;
    uint8_t *b = slurp(path, &len);
    out[0] = 0;
    for (char *line = strtok((char *)b, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "\"type\":\"train\"")) continue;
        char *l = strstr(line, "\"loss\":");
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%.*s;", (int)strcspn(l + 7, ","), l + 7);
    }
    free(b);
}

static void train(const char *out, const char *extra, const char *env) {
    char args[2048];
    snprintf(args, sizeof args, "train %s %s --out %s/%s %s", MODEL, TRAIN, dir, out, extra ? extra : "");
    result r = run(env, args);
    if (r.status != 0) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
}

static void path_of(char *buf, size_t n, const char *run_dir, const char *file) {
    snprintf(buf, n, "%s/%s/%s", dir, run_dir, file);
}

// <dir>/<run_dir>/<file> read whole, NUL-terminated (free it)
static char *run_text(const char *run_dir, const char *file) {
    char p[800];
    path_of(p, sizeof p, run_dir, file);
    size_t n;
    return (char *)slurp(p, &n);
}

static void test_same_seed_same_run(void **state) {
    (void)state;
    train("a", NULL, NULL);
    train("new/nested/a2", NULL, NULL);   // --out parents that do not exist yet are created (like `make run`'s runs/tiny)
    char p1[700], p2[700], l1[4096], l2[4096];
    path_of(p1, sizeof p1, "a", "metrics.jsonl");
    path_of(p2, sizeof p2, "new/nested/a2", "metrics.jsonl");
    losses(p1, l1, sizeof l1);
    losses(p2, l2, sizeof l2);
    printf("losses: %s\n", l1);
    assert_string_equal(l1, l2);
    path_of(p1, sizeof p1, "a", "ckpt_000020/model.safetensors");
    path_of(p2, sizeof p2, "new/nested/a2", "ckpt_000020/model.safetensors");
    tu_check("same seed: final weights differ (files equal = 0)", !same_file(p1, p2), 0);
    // --overwrite starts the run in a2 over: the same run again, bit for bit
    train("new/nested/a2", "--overwrite", NULL);
    path_of(p2, sizeof p2, "new/nested/a2", "metrics.jsonl");
    losses(p2, l2, sizeof l2);
    assert_string_equal(l1, l2);
    path_of(p2, sizeof p2, "new/nested/a2", "ckpt_000020/model.safetensors");
    tu_check("--overwrite: final weights differ (files equal = 0)", !same_file(p1, p2), 0);
}

static void test_resume_is_bit_exact(void **state) {
    (void)state;
    train("b", "--debug-stop-at 10", NULL);
    char p[700];
    path_of(p, sizeof p, "b", "ckpt_000020");
    struct stat sb;
    assert_int_not_equal(stat(p, &sb), 0);      // it really stopped at 10
    train("b", "--resume", NULL);
    char p1[700], p2[700], l1[4096], l2[4096];
    path_of(p1, sizeof p1, "a", "metrics.jsonl");
    path_of(p2, sizeof p2, "b", "metrics.jsonl");
    losses(p1, l1, sizeof l1);
    losses(p2, l2, sizeof l2);
    assert_string_equal(l1, l2);
    path_of(p1, sizeof p1, "a", "ckpt_000020/model.safetensors");
    path_of(p2, sizeof p2, "b", "ckpt_000020/model.safetensors");
    tu_check("10 + resume 10 vs 20 straight: weights differ (files equal = 0)", !same_file(p1, p2), 0);
    // the optimizer moments and data positions (the state file's tensors; its metadata
    // also holds the wall time, which differs)
    path_of(p1, sizeof p1, "a", "ckpt_000020/state.safetensors");
    path_of(p2, sizeof p2, "b", "ckpt_000020/state.safetensors");
    lm_safetensors sa, sb2;
    assert_int_equal(lm_st_open(&sa, p1), LM_OK);
    assert_int_equal(lm_st_open(&sb2, p2), LM_OK);
    int same = sa.data_size == sb2.data_size && memcmp(sa.data, sb2.data, sa.data_size) == 0;
    lm_st_close(&sa);
    lm_st_close(&sb2);
    tu_check("10 + resume 10 vs 20 straight: optimizer moments / data position differ", !same, 0);
}

static void test_nonfinite_steps(void **state) {
    (void)state;
    train("nan1", "--debug-nan-steps 3", NULL);
    char *b = run_text("nan1", "metrics.jsonl");
    assert_non_null(strstr(b, "\"step\":4,\"loss\""));
    assert_non_null(strstr(b, "\"skipped\":1,\"skipped_total\":1"));
    assert_non_null(strstr(b, "\"step\":20,"));
    free(b);
    char args[2048];
    snprintf(args, sizeof args, "train %s %s --out %s/nan2 --debug-nan-steps 3,4,5 --max-skips 3", MODEL, TRAIN, dir);
    result r = run(NULL, args);
    printf("stderr: %s", r.err);
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.err, "non-finite"));
    // the last good weights were saved and load
    snprintf(args, sizeof args, "eval --model %s/nan2/ckpt_000006 --batches 1 --batch 2 --seq 64 -t 2", dir);
    assert_int_equal(run(NULL, args).status, 0);
}

static void test_kill_during_save(void **state) {
    (void)state;
    char args[2048];
    snprintf(args, sizeof args, "train %s %s --out %s/k --save-every 5", MODEL, TRAIN, dir);
    result r = run("LINMOE_TEST_CRASH_IN_SAVE=10", args);
    printf("killed by signal %d\n", r.signal);
    assert_int_equal(r.signal, 9);
    char *latest = run_text("k", "latest");
    assert_string_equal(latest, "ckpt_000005\n");
    free(latest);
    snprintf(args, sizeof args, "eval --model %s/k/ckpt_000005 --batches 1 --batch 2 --seq 64 -t 2", dir);
    assert_int_equal(run(NULL, args).status, 0);
    // resuming from step 5 ends where the uninterrupted run ends
    snprintf(args, sizeof args, "train %s %s --out %s/k --save-every 5 --resume", MODEL, TRAIN, dir);
    r = run(NULL, args);
    if (r.status) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
    char p1[700], p2[700];
    path_of(p1, sizeof p1, "a", "ckpt_000020/model.safetensors");
    path_of(p2, sizeof p2, "k", "ckpt_000020/model.safetensors");
    tu_check("killed at the step-10 save, resumed from 5: weights differ", !same_file(p1, p2), 0);
}

// context stages: the sequence length follows the stage list and the tokens per step
// stay constant (fewer sequences per batch at longer lengths)
static void test_context_stages(void **state) {
    (void)state;
    char args[2048];
    snprintf(args, sizeof args,
             "train %s --stages 32:3,64:2,128:2 --batch 8 --eval-every 0 --save-every 0 --samples 0 -q -t 2 "
             "--out %s/stages", MODEL, dir);
    result r = run(NULL, args);
    if (r.status) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
    char *b = run_text("stages", "metrics.jsonl");
    const int want[7] = {32, 32, 32, 64, 64, 128, 128};
    int k = 0;
    for (char *line = strtok(b, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "\"type\":\"train\"")) continue;
        char *q = strstr(line, "\"seq_len\":");
        assert_non_null(q);
        assert_true(k < 7);
        assert_int_equal(atoi(q + 10), want[k]);
        k++;
    }
    assert_int_equal(k, 7);
    free(b);
    b = run_text("stages", "metrics.jsonl");
    assert_non_null(strstr(b, "\"tokens_per_step\":256"));
    free(b);
}

// ---------------------------------------------------------------------------
// bad input

static void expect_error(const char *label, const char *args, const char *word) {
    char ck[700];
    path_of(ck, sizeof ck, "a", "ckpt_000020/model.safetensors");
    size_t n0;
    uint8_t *before = slurp(ck, &n0);
    result r = run(NULL, args);
    int lines = 0;
    for (const char *c = r.err; *c; c++) lines += *c == '\n';
    printf("%-22s exit %d: %s", label, r.status, r.err);
    assert_true(r.status != 0 && r.signal == 0);
    assert_int_equal(lines, 1);
    assert_non_null(strstr(r.err, "error"));
    if (word && !strstr(r.err, word)) fail_msg("%s: expected '%s' in the message", label, word);
    size_t n1;
    uint8_t *after = slurp(ck, &n1);
    assert_true(n0 == n1 && memcmp(before, after, n0) == 0);   // nothing on disk lost
    free(before);
    free(after);
}

// writes `bytes` to <dir>/<name>, then expects a training run given `flag`<that path> to fail
static void expect_error_on_file(const char *label, const char *name, const void *bytes, size_t n, const char *flag,
                                 const char *word) {
    char p[700], args[3000];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(lm_write_file_atomic(p, bytes, n), LM_OK);
    snprintf(args, sizeof args, "train %s %s --out %s/x %s%s", MODEL, TRAIN, dir, flag, p);
    expect_error(label, args, word);
}

// the bytes of <run_dir>/<file> equal `want` (n bytes)
static int file_is(const char *run_dir, const char *file, const uint8_t *want, size_t n) {
    char p[800];
    path_of(p, sizeof p, run_dir, file);
    size_t m;
    uint8_t *b = slurp(p, &m);
    int same = m == n && memcmp(b, want, n) == 0;
    free(b);
    return same;
}

// values out of range, folders where files belong, and runs that must not touch an
// earlier run's folder (found by an adversarial pass over the CLI)
static void test_bad_values_and_run_folders(void) {
    char args[3000], p[700];
    const char *bad[][2] = {
        {"--seq 0", "--seq"},               {"--steps 0", "--steps"},     {"--steps -1", "--steps"},
        {"--threads 100000", "--threads"},
        // past the largest `real` (float: 3.4e38; the f64 build's double: 1.8e308)
        {sizeof(real) == 4 ? "--lr 1e39" : "--lr 1e309", "--lr"},        {"--seed ' -1'", "--seed"},
        {"--max-skips -1", "--max-skips"},   {"--muon-momentum 5", "momentum"}, {"--qk-clip -1", "--qk-clip"},
        {"--samples -1", "--samples"},      {"--batch 2000000000", "tokens per step"},
        {"--stages 2147483647:1", "--stages"}, {"--set n_experts=-1", "n_experts"},
        {"--set qb_bins=1000000000", "qb_bins"}, {"--set kda_heads=2147483647", "kda_heads"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "train %s %s --out %s/x %s", MODEL, TRAIN, dir, bad[i][0]);
        expect_error(bad[i][0], args, bad[i][1]);
    }
    // 2.78e12 parameters: more memory than any machine has, refused before allocating
    snprintf(args, sizeof args, "train -p k3 --steps 1 --batch 1 --seq 64 -q --out %s/x", dir);
    expect_error("k3 on the CPU", args, "GB of memory");
    snprintf(args, sizeof args, "train %s %s --out ''", MODEL, TRAIN);
    expect_error("empty --out", args, "--out");
    snprintf(args, sizeof args, "train %s %s --out %s/x --init %s/a", MODEL, TRAIN, dir, dir);
    expect_error("--init a folder", args, "not a regular file");
    expect_error_on_file("config value 1e999", "inf.json", "{\"norm_eps\": 1e999}", 19, "--config ", "finite");
    expect_error("plan negative seq", "plan --seq -5", "--seq");
    snprintf(args, sizeof args, "eval --model %s/a --seq -1", dir);
    expect_error("eval negative seq", args, "--seq");
    // a run folder stands for its latest checkpoint
    snprintf(args, sizeof args, "eval --model %s/a --batches 1 --batch 2 --seq 64 -t 2", dir);
    assert_int_equal(run(NULL, args).status, 0);

    // a run without checkpoints: a new run into its folder is refused, its metrics kept
    train("keep", "--no-checkpoints --steps 3", NULL);
    path_of(p, sizeof p, "keep", "metrics.jsonl");
    size_t nm;
    uint8_t *m0 = slurp(p, &nm);
    snprintf(args, sizeof args, "train %s %s --out %s/keep", MODEL, TRAIN, dir);
    expect_error("run without checkpoints", args, "--overwrite");
    tu_check("refused run: metrics of a run without checkpoints changed (differ = 1)", !file_is("keep", "metrics.jsonl", m0, nm), 0);
    free(m0);
    // --overwrite with inputs that fail to load leaves the earlier run as it was
    path_of(p, sizeof p, "a", "metrics.jsonl");
    m0 = slurp(p, &nm);
    snprintf(args, sizeof args, "train %s %s --out %s/a --overwrite --data %s/no_such_file.txt", MODEL, TRAIN, dir, dir);
    expect_error("--overwrite, bad data", args, "no_such_file");
    tu_check("failed --overwrite: metrics changed (differ = 1)", !file_is("a", "metrics.jsonl", m0, nm), 0);
    // ... also when the data opens but its first batch fails (a task longer than the row)
    snprintf(args, sizeof args, "train %s --steps 20 --batch 2 --seq 8 -q --out %s/a --overwrite", MODEL, dir);
    expect_error("--overwrite, row too short", args, "needs examples");
    tu_check("failed --overwrite (first batch): metrics changed (differ = 1)", !file_is("a", "metrics.jsonl", m0, nm), 0);
    // a run that failed on its data leaves nothing behind, so the corrected command runs
    snprintf(args, sizeof args, "train %s --steps 20 --batch 2 --seq 8 -q --out %s/retry", MODEL, dir);
    expect_error("row too short", args, "needs examples");
    train("retry", NULL, NULL);
    // resuming a finished run: nothing to do, nothing changed
    snprintf(args, sizeof args, "train %s %s --out %s/a --resume", MODEL, TRAIN, dir);
    expect_error("resume a finished run", args, "already finished");
    tu_check("resume of a finished run: metrics changed (differ = 1)", !file_is("a", "metrics.jsonl", m0, nm), 0);
    free(m0);
    // a model whose vocab has no byte tokens cannot take a text prompt
    snprintf(p, sizeof p, "%s/two_tokens.bin", dir);
    char cmd[1600];
    snprintf(args, sizeof args, "train %s %s --set vocab=2 --data shards:%s --out %s/v2 --samples 0", MODEL, TRAIN, p, dir);
    {
        // a shard of 4096 tokens in {0, 1} (uint32 tokens after the 20-byte header)
        lm_shard_writer w;
        assert_int_equal(lm_shard_writer_open(&w, p, 2), LM_OK);
        uint32_t t[4096];
        for (int i = 0; i < 4096; i++) t[i] = (uint32_t)(i * 7 % 3 == 0);
        assert_int_equal(lm_shard_writer_append(&w, t, 4096), LM_OK);
        assert_int_equal(lm_shard_writer_close(&w), LM_OK);
    }
    assert_int_equal(run(NULL, args).status, 0);
    snprintf(cmd, sizeof cmd, "generate --model %s/v2 --prompt hello", dir);
    expect_error("prompt, vocab 2", cmd, "vocab");
}

static void test_bad_input(void **state) {
    (void)state;
    char args[3000], p[700], q[700];
    const char *ck = "a/ckpt_000020";
    snprintf(args, sizeof args, "generate --model %s/nothing_here --prompt x", dir);
    expect_error("missing checkpoint", args, "cannot open");
    // damaged copies of a good checkpoint
    path_of(p, sizeof p, ck, "model.safetensors");
    size_t n;
    uint8_t *b = slurp(p, &n);
    snprintf(q, sizeof q, "%s/trunc.safetensors", dir);
    assert_int_equal(lm_write_file_atomic(q, b, n / 2), LM_OK);
    snprintf(args, sizeof args, "generate --model %s --prompt x", q);
    expect_error("truncated checkpoint", args, "truncated");
    b[n - 100] ^= 0x04;
    snprintf(q, sizeof q, "%s/flip.safetensors", dir);
    assert_int_equal(lm_write_file_atomic(q, b, n), LM_OK);
    snprintf(args, sizeof args, "eval --model %s", q);
    expect_error("bit-flipped checkpoint", args, "checksum");
    memcpy(b, "\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
    snprintf(q, sizeof q, "%s/magic.safetensors", dir);
    assert_int_equal(lm_write_file_atomic(q, b, n), LM_OK);
    snprintf(args, sizeof args, "generate --model %s --prompt x", q);
    expect_error("wrong magic", args, "corrupt");
    free(b);
    // a checkpoint of another config
    path_of(p, sizeof p, ck, "model.safetensors");
    snprintf(args, sizeof args, "train %s --set d_model=48 %s --out %s/x --init %s", MODEL, TRAIN, dir, p);
    expect_error("config mismatch (--init)", args, "config mismatch");
    snprintf(args, sizeof args, "train %s --set top_k=1 %s --out %s/a --resume", MODEL, TRAIN, dir);
    expect_error("config mismatch (--resume)", args, "config");
    // data
    expect_error_on_file("malformed shard", "bad_shard.bin", "LMTS\x01\x00\x00\x00garbage", 15, "--data shards:", "bad_shard.bin");
    expect_error_on_file("empty text file", "empty.txt", "", 0, "--data ", "empty");
    // flags and values
    expect_error("unknown flag", "train --bogus 3", "--bogus");
    expect_error("unknown command", "trian", "trian");
    expect_error("missing value", "train --steps", "--steps");
    expect_error("not a number", "train --lr fast", "--lr");
    snprintf(args, sizeof args, "train %s %s --out %s/x --batch 0", MODEL, TRAIN, dir);
    expect_error("zero batch", args, "--batch");
    snprintf(args, sizeof args, "train %s %s --out %s/x --lr -1", MODEL, TRAIN, dir);
    expect_error("negative lr", args, "--lr");
    expect_error("top_k > experts", "train --set top_k=99", "top_k");
    expect_error("bad stages", "train --stages 256:x", "--stages");
    expect_error("bad preset", "train --preset enormous", "enormous");
    snprintf(args, sizeof args, "train %s %s --out %s/a --resume", MODEL, "--steps 30 --batch 2 --seq 64 -q", dir);
    expect_error("resume with other options", args, "differ");
    // a fresh run into a folder that holds one: refused without --overwrite (files untouched)
    path_of(p, sizeof p, ck, "model.safetensors");
    path_of(q, sizeof q, "a", "metrics.jsonl");
    size_t nw, nm;
    uint8_t *w0 = slurp(p, &nw), *m0 = slurp(q, &nm);
    snprintf(args, sizeof args, "train %s %s --out %s/a", MODEL, TRAIN, dir);
    expect_error("existing run", args, "--overwrite");
    size_t nw1, nm1;
    uint8_t *w1 = slurp(p, &nw1), *m1 = slurp(q, &nm1);
    tu_check("refused run: checkpoint and metrics changed (bytes differ = 1)",
             !(nw == nw1 && nm == nm1 && memcmp(w0, w1, nw) == 0 && memcmp(m0, m1, nm) == 0), 0);
    free(w0); free(m0); free(w1); free(m1);
    // the checkpoint we damaged copies of still loads
    snprintf(args, sizeof args, "eval --model %s/%s --batches 1 --batch 2 --seq 64 -t 2", dir, ck);
    assert_int_equal(run(NULL, args).status, 0);
    test_bad_values_and_run_folders();
}

// `linmoe ablate` end to end on a tiny model: one run per variant, the report, and no
// checkpoints unless --checkpoints asks for them.
static int exists(const char *run_dir, const char *file) {
    char p[800];
    path_of(p, sizeof p, run_dir, file);
    return access(p, F_OK) == 0;
}

static void test_ablate(void **state) {
    (void)state;
    char args[3000];
    const char *study = "--study gate --seeds 1 --steps 4 --batch 2 --seq 64 --eval-every 2 --eval-batches 1 -t 2";
    snprintf(args, sizeof args, "ablate %s %s --out %s/abl", MODEL, study, dir);
    result r = run(NULL, args);
    if (r.status != 0) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
    assert_true(exists("abl/gate", "report.html") && exists("abl/gate", "report.md"));
    assert_true(exists("abl/gate/bounded-seed1", "metrics.jsonl") && exists("abl/gate/unbounded-seed1", "metrics.jsonl"));
    tu_check("ablate: checkpoint written without --checkpoints (exists = 1)", exists("abl/gate/bounded-seed1", "latest"), 0);
    char *md = run_text("abl/gate", "report.md");
    assert_non_null(strstr(md, "| bounded | 1 |"));
    assert_non_null(strstr(md, "| unbounded | 1 |"));
    free(md);
    // the same study again, keeping checkpoints: it replaces its runs and saves each one's last step
    snprintf(args, sizeof args, "ablate %s %s --out %s/abl --checkpoints", MODEL, study, dir);
    assert_int_equal(run(NULL, args).status, 0);
    assert_true(exists("abl/gate/bounded-seed1", "ckpt_000004/model.safetensors"));
    assert_true(exists("abl/gate/unbounded-seed1", "latest"));
}

// the per-task example counts ("n":…) of a run's first eval record, concatenated
static void first_eval_counts(const char *run_dir, char *out, size_t cap) {
    char *m = run_text(run_dir, "metrics.jsonl");
    const char *e = strstr(m, "\"type\":\"eval\"");
    assert_non_null(e);
    const char *eol = strchr(e, '\n');
    out[0] = 0;
    for (const char *p = strstr(e, "\"n\":"); p && (!eol || p < eol); p = strstr(p + 1, "\"n\":"))
        snprintf(out + strlen(out), cap - strlen(out), "%d,", atoi(p + 4));
    free(m);
    assert_true(out[0] != 0);
}

// --no-checkpoints writes none; the end line carries the median step, tokens/s and the model
// FLOPs per token; a micro-batched run evaluates (in batches of its micro-batch) the same
// sequences as an unbatched one, also when the micro-batch does not divide the batch
static void test_no_checkpoints_and_end_line(void **state) {
    (void)state;
    train("nc", "--no-checkpoints --micro-batch 1 --eval-every 10 --eval-batches 1", NULL);
    train("nc3", "--no-checkpoints --batch 3 --eval-every 10 --eval-batches 2", NULL);
    train("nc3m2", "--no-checkpoints --batch 3 --micro-batch 2 --eval-every 10 --eval-batches 2", NULL);
    char n_full[256], n_micro[256];
    first_eval_counts("nc3", n_full, sizeof n_full);
    first_eval_counts("nc3m2", n_micro, sizeof n_micro);
    printf("eval examples per task: batch 3 %s micro-batch 2 %s\n", n_full, n_micro);
    tu_check("eval examples differ between micro-batch 2 and none (differs = 1)", strcmp(n_full, n_micro) != 0, 0);
    tu_check("--no-checkpoints: 'latest' written (exists = 1)", exists("nc", "latest"), 0);
    tu_check("--no-checkpoints: step-20 checkpoint written (exists = 1)", exists("nc", "ckpt_000020"), 0);
    char *m = run_text("nc", "metrics.jsonl");
    const char *end = strstr(m, "\"type\":\"end\"");
    assert_non_null(end);
    assert_non_null(strstr(end, "\"median_tok_s\":"));
    const char *fl = strstr(end, "\"model_flops_per_token\":");
    assert_non_null(fl);
    double flops = atof(fl + strlen("\"model_flops_per_token\":"));
    printf("end line: model FLOPs per token %g\n", flops);
    assert_true(flops > 1e5 && flops < 1e8);   // the test model: ~1e6
    assert_non_null(strstr(m, "\"type\":\"eval\""));
    assert_null(strstr(end, "\"checkpoint\""));
    free(m);
}

// without --out a run goes to runs/<config file's name> or runs/<preset>, under the working folder
static void test_default_run_folder(void **state) {
    (void)state;
    char env[700], args[2048], cfg[700];
    snprintf(cfg, sizeof cfg, "%s/cfgs", dir);
    mkdir(cfg, 0755);
    snprintf(cfg, sizeof cfg, "%s/cfgs/mini.v2.json", dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{}\n", f);   // the preset as it is
    fclose(f);
    snprintf(env, sizeof env, "cd %s &&", dir);
    snprintf(args, sizeof args, "train --config cfgs/mini.v2.json %s %s --steps 2 --no-checkpoints", MODEL, TRAIN);
    result r = run(env, args);
    if (r.status != 0) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
    tu_check("--config cfgs/mini.v2.json: runs/mini.v2/metrics.jsonl missing (1 = missing)", !exists("runs/mini.v2", "metrics.jsonl"), 0);
    // the small preset (its sizes overridden by MODEL): runs/small — runs/tiny until session 40
    snprintf(args, sizeof args, "train --preset small %s %s --steps 2 --no-checkpoints", MODEL, TRAIN);
    r = run(env, args);
    if (r.status != 0) printf("stderr: %s\n", r.err);
    assert_int_equal(r.status, 0);
    tu_check("--preset small: runs/small/metrics.jsonl missing (1 = missing)", !exists("runs/small", "metrics.jsonl"), 0);
    tu_check("no --out: a run went to runs/tiny (exists = 1)", exists("runs/tiny", "metrics.jsonl"), 0);
}

int main(void) {
    const char *b = getenv("LM_BIN");
    snprintf(bin, sizeof bin, "%s", b ? b : "build/f32/linmoe");
    char *abs = realpath(bin, NULL);   // test_default_run_folder runs it from another folder
    if (abs) {
        snprintf(bin, sizeof bin, "%s", abs);
        free(abs);
    }
    snprintf(dir, sizeof dir, "/tmp/linmoe_cli_test_%d", (int)getpid());
    mkdir(dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_run), cmocka_unit_test(test_resume_is_bit_exact),
        cmocka_unit_test(test_nonfinite_steps),    cmocka_unit_test(test_kill_during_save),
        cmocka_unit_test(test_context_stages),     cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_ablate),             cmocka_unit_test(test_no_checkpoints_and_end_line),
        cmocka_unit_test(test_default_run_folder),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
