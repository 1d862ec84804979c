// test_public_api.c — a program that includes only <linmoe.h> can build a model,
// run it, take a gradient step and generate, as the header's summary says.
#include "harness.h"
#include "linmoe.h"

static void test_header_summary_works(void **state) {
    (void)state;
    lm_config c;
    assert_int_equal(lm_config_preset(&c, "tiny"), LM_OK);
    c.n_layers = 2;
    c.layer_types[0] = 0;
    assert_int_equal(lm_config_finalize(&c), LM_OK);
    lm_model *m = lm_model_create(&c, &lm_cpu_ops, 1);
    int tok[32], tgt[32];
    for (int i = 0; i < 32; i++) { tok[i] = 'a' + i % 7; tgt[i] = 'a' + (i + 1) % 7; }
    lm_fwd_opts fo = {.training = 1, .capacity = -1, .aux_weight = 1};
    lm_optim_config oc;
    lm_optim_default(&oc);
    lm_optim o;
    lm_optim_init(&o, m, &oc);
    double first = 0, last = 0;
    for (int s = 0; s < 5; s++) {
        lm_model_zero_grads(m);
        last = lm_model_forward(m, tok, tgt, 1, 32, fo);
        if (s == 0) first = last;
        lm_model_backward(m, (real)(1.0 / m->last_count));
        lm_optim_step(&o, m, 1e-2);
    }
    assert_true(last < first);
    lm_sampler sm;
    lm_sampler_init(&sm, 0.8, 20, 0.9, 3);
    lm_gen_opts go = {.max_new = 8, .stop_token = -1};
    int out[8];
    assert_int_equal(lm_generate(m, tok, 5, out, &go, &sm), 8);
    for (int i = 0; i < 8; i++) assert_true(out[i] >= 0 && out[i] < c.vocab);
    lm_sampler_free(&sm);
    lm_optim_free(&o, m);
    lm_model_free(m);
}

// the sampler: greedy is the argmax; top-k 1 is greedy at any temperature; a fixed seed
// repeats; frequencies follow softmax(logits / T)
static void test_sampler(void **state) {
    (void)state;
    real logits[5] = {0.1, 2.0, -1, 1.5, 0.3};
    lm_sampler s;
    lm_sampler_init(&s, 0, 0, 1, 1);
    assert_int_equal(lm_sample(&s, logits, 5), 1);
    lm_sampler_free(&s);
    lm_sampler_init(&s, 5, 1, 1, 1);
    for (int i = 0; i < 20; i++) assert_int_equal(lm_sample(&s, logits, 5), 1);
    lm_sampler_free(&s);
    int cnt[5] = {0};
    lm_sampler_init(&s, 1, 0, 1, 7);
    const int n = 20000;
    for (int i = 0; i < n; i++) cnt[lm_sample(&s, logits, 5)]++;
    double z = 0;
    for (int v = 0; v < 5; v++) z += exp(logits[v]);
    double worst = 0;
    for (int v = 0; v < 5; v++) worst = tu_worst(worst, fabs((double)cnt[v] / n - exp(logits[v]) / z));
    tu_check("sampler frequencies vs softmax (max abs)", worst, 0.015);
    lm_sampler_free(&s);
    // p = softmax(logits) = (.075, .503, .025, .305, .092): top-p 0.5 keeps token 1 only,
    // top-p 0.7 keeps tokens 1 and 3 (both must appear)
    lm_sampler_init(&s, 1, 0, 0.5, 7);
    for (int i = 0; i < 200; i++) assert_int_equal(lm_sample(&s, logits, 5), 1);
    lm_sampler_free(&s);
    int seen[5] = {0};
    lm_sampler_init(&s, 1, 0, 0.7, 7);
    for (int i = 0; i < 400; i++) seen[lm_sample(&s, logits, 5)]++;
    assert_true(seen[1] > 0 && seen[3] > 0 && seen[0] + seen[2] + seen[4] == 0);
    lm_sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_header_summary_works), cmocka_unit_test(test_sampler)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
