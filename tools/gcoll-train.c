/* gcoll-train.c: data-parallel MLP training on Fashion-MNIST through gcoll's bucketer, to
 * show what gradient compression does to accuracy (the loop lives in tools/train/). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcoll.h"
#include "train/gemm.h"
#include "train/idx.h"
#include "train/modes.h"
#include "train/train.h"
#include "tool_error.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static const char usage_text[] =
    "usage: gcoll-run -n P gcoll-train [options]\n"
    "Trains a 784-512-256-10 ReLU MLP on Fashion-MNIST with minibatch SGD, data-parallel over\n"
    "the job's ranks; gradients are compressed and averaged by gcoll's bucketer layer by\n"
    "layer during the backward pass. Rank 0 prints one line per epoch and ends with the\n"
    "summary lines below.\n"
    "  -e, --epochs N          epochs (5)\n"
    "  -c, --compressor SPEC   codec of every gradient (GCOLL_COMPRESSOR, else none);\n"
    "                          e.g. topk:density=0.001, topk:density=0.001,ef=0, sign,\n"
    "                          dgc:density=0.001,momentum=0.9,warmup_steps=400,schedule=exp\n"
    "  -p, --policy RULES      codec per tensor, GCOLL_LAYER_POLICY syntax (GCOLL_LAYER_POLICY);\n"
    "                          tensors: fc1.weight, fc1.bias, ..., fc3.bias\n"
    "  -s, --seed S            initialization and shuffle seed (1)\n"
    "  -d, --data DIR          directory of the IDX files (" DEFAULT_DATA ")\n"
    "  -b, --batch B           examples per rank per step (64)\n"
    "  -l, --lr X              learning rate (0.05)\n"
    "      --lr-schedule S     constant, cosine (to 0 over the run) or step (x0.1 at 50%\n"
    "                          and 75% of the steps) (cosine; constant with --async)\n"
    "  -m, --momentum M        SGD momentum (0.9; 0 on tensors whose codec takes it: dgc,\n"
    "                          and random-k with error feedback, whose spec then gets\n"
    "                          momentum=0.9 when it has no momentum=; 0.7 with --async\n"
    "                          and --staleness S > 0)\n"
    "      --limit N           train on the first N examples only\n"
    "      --test-limit N      evaluate on the first N test examples only\n"
    "      --bucket-bytes N    fuse gradients into buckets of N bytes (1: one bucket per\n"
    "                          tensor, the default; 0: GCOLL_BUCKET_BYTES)\n"
    "      --warmup-frac F     top-k, random-k and DGC specs without warmup_steps warm up\n"
    "                          over this fraction of the steps (0.1; 0: none), from\n"
    "                          warmup_start (1: dense) by schedule (exp)\n"
    "      --csv               CSV per-epoch lines (comments start with #)\n"
    "      --save FILE         rank 0 writes the final parameters (float32, layer by layer,\n"
    "                          weights then bias)\n"
    "  -h, --help              this text\n";

static int parse_num(const char *opt, const char *arg, double lo, double hi, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(arg, &end);
    if (errno || end == arg || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "gcoll-train: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi,
                arg);
        return -1;
    }
    *v = x;
    return 0;
}

static int save_params(const char *path, const float *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), n, f) != n) {
        fprintf(stderr, "gcoll-train: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "gcoll-train: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The options into o, mo, data_dir and save (defaults first, then the environment's
 * GCOLL_COMPRESSOR, GCOLL_LAYER_POLICY and GCOLL_BUCKET_BYTES); -1 to go on, else the exit
 * code (0 after --help, 2 after a bad option). One case per option, kept together so the
 * option table reads in one place. */
static int parse_opts(int argc, char **argv, train_opts_t *o, train_mode_opts_t *mo,
                      const char **data_dir, const char **save)
{
    enum {
        OPT_LIMIT = 256,
        OPT_TEST_LIMIT,
        OPT_BUCKET,
        OPT_CSV,
        OPT_SAVE,
        OPT_WARMUP,
        OPT_LR_SCHED
    };
    static const struct option longopts[] = {
        {"epochs", required_argument, NULL, 'e'},
        {"compressor", required_argument, NULL, 'c'},
        {"policy", required_argument, NULL, 'p'},
        {"seed", required_argument, NULL, 's'},
        {"data", required_argument, NULL, 'd'},
        {"batch", required_argument, NULL, 'b'},
        {"lr", required_argument, NULL, 'l'},
        {"momentum", required_argument, NULL, 'm'},
        {"lr-schedule", required_argument, NULL, OPT_LR_SCHED},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"test-limit", required_argument, NULL, OPT_TEST_LIMIT},
        {"bucket-bytes", required_argument, NULL, OPT_BUCKET},
        {"csv", no_argument, NULL, OPT_CSV},
        {"warmup-frac", required_argument, NULL, OPT_WARMUP},
        {"save", required_argument, NULL, OPT_SAVE},
        {"help", no_argument, NULL, 'h'},
        TRAIN_MODE_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    train_opts_default(o);
    train_mode_opts_default(mo);
    const char *env = getenv("GCOLL_COMPRESSOR");
    if (env && *env)
        o->compressor = env;
    env = getenv("GCOLL_LAYER_POLICY");
    if (env)
        o->policy = env;
    if (getenv("GCOLL_BUCKET_BYTES"))
        o->bucket_bytes = 0;
    *data_dir = DEFAULT_DATA;
    *save = NULL;
    double v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":e:c:p:s:d:b:l:m:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'e':
            if (parse_num("--epochs", optarg, 1, 100000, &v))
                return 2;
            o->epochs = (int)v;
            break;
        case 'c':
            o->compressor = optarg;
            break;
        case 'p':
            o->policy = optarg;
            break;
        case 's':
            if (parse_num("--seed", optarg, 0, 9007199254740992.0, &v))
                return 2;
            o->seed = (uint64_t)v;
            break;
        case 'd':
            *data_dir = optarg;
            break;
        case 'b':
            if (parse_num("--batch", optarg, 1, 65536, &v))
                return 2;
            o->batch = (int)v;
            break;
        case 'l':
            if (parse_num("--lr", optarg, 0, 1e6, &v))
                return 2;
            o->lr = (float)v;
            break;
        case 'm':
            if (parse_num("--momentum", optarg, 0, 0.999999, &v))
                return 2;
            o->momentum = (float)v;
            break;
        case OPT_LIMIT:
        case OPT_TEST_LIMIT:
            if (parse_num(c == OPT_LIMIT ? "--limit" : "--test-limit", optarg, 1, 1e9, &v))
                return 2;
            *(c == OPT_LIMIT ? &o->limit : &o->test_limit) = (size_t)v;
            break;
        case OPT_BUCKET:
            if (parse_num("--bucket-bytes", optarg, 0, 1e12, &v))
                return 2;
            o->bucket_bytes = (size_t)v;
            break;
        case OPT_LR_SCHED:
            if ((o->lr_schedule = train_lr_schedule_parse(optarg)) < 0) {
                fprintf(stderr,
                        "gcoll-train: --lr-schedule: '%s' is not constant, cosine or "
                        "step\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_CSV:
            o->csv = 1;
            break;
        case OPT_WARMUP:
            if (parse_num("--warmup-frac", optarg, 0, 1, &o->warmup_frac))
                return 2;
            break;
        case OPT_SAVE:
            *save = optarg;
            break;
        case 'h':
            fputs(usage_text, stdout);
            fputs(train_mode_usage, stdout);
            printf("built with: gzip %s, sgemm %s\n", train_idx_have_gzip() ? "yes" : "no",
                   train_sgemm_name());
            return 0;
        case ':':
            fprintf(stderr, "gcoll-train: option '%s' needs an argument\n", argv[optind - 1]);
            return 2;
        default:
            if (c >= TRAIN_MODE_OPT_BASE && c < TRAIN_MODE_OPT_END) {
                if (train_mode_option(mo, c, optarg))
                    return 2;
                break;
            }
            fprintf(stderr, "gcoll-train: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gcoll-train: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    train_opts_t o;
    train_mode_opts_t mo;
    const char *data_dir, *save;
    int prc = parse_opts(argc, argv, &o, &mo, &data_dir, &save);
    if (prc >= 0)
        return prc;
    /* random-k with classic error feedback takes the default momentum into its codec
     * (train_randomk_spec); not in the modes, whose workers run their own momentum */
    char rkspec[256];
    const char *rk = o.momentum < 0.0f && !(o.policy && *o.policy) && !train_mode_active(&mo)
                         ? train_randomk_spec(o.compressor, 0.9f, rkspec, sizeof(rkspec))
                         : NULL;
    if (rk)
        o.compressor = rk;
    char err[512];
    if (gcoll_compressor_check(o.compressor, err, sizeof(err)) != GCOLL_OK) {
        const char *env = getenv("GCOLL_COMPRESSOR"); /* where the spec came from */
        fprintf(stderr, "gcoll-train: %s: %s\n",
                env && o.compressor == env ? "GCOLL_COMPRESSOR" : "--compressor", err);
        return 2;
    }
    if (train_mode_check(&mo, &o))
        return 2;

    /* Data first: a missing or corrupt file fails every rank at once, before any rank
     * waits for the others to join. */
    train_data_t d;
    if (train_data_load(data_dir, &d, err, sizeof(err)) != 0) {
        fprintf(stderr,
                "gcoll-train: cannot load Fashion-MNIST: %s\n"
                "gcoll-train: (Debian: apt-get install dataset-fashion-mnist, or pass --data DIR "
                "holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz)\n",
                err);
        return 1;
    }
    gcoll_comm_t *comm = NULL;
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        tool_error("gcoll-train", "gcoll_comm_init", " (run under gcoll-run -n P)");
        train_data_free(&d);
        return 1;
    }
    train_result_t res;
    gcoll_counters_t c0;
    gcoll_comm_counters(comm, &c0);
    double t0 = train_now_s();
    int rc = train_mode_active(&mo) ? train_run_mode(&o, &mo, &d, comm, stdout, save != NULL, &res)
                                    : train_run(&o, &d, comm, stdout, save != NULL, &res);
    if (rc == 0)
        train_print_summary(stdout, comm, &c0, train_now_s() - t0,
                            train_total_steps(&o, &d, gcoll_comm_size(comm)));
    if (rc == 0 && save && gcoll_comm_rank(comm) == 0)
        rc = save_params(save, res.params, res.nparams);
    free(res.params);
    st = gcoll_comm_destroy(comm);
    train_data_free(&d);
    if (rc == 0 && st != GCOLL_OK) {
        fprintf(stderr, "gcoll-train: gcoll_comm_destroy: %s: %s\n", gcoll_status_string(st),
                gcoll_last_error());
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}
