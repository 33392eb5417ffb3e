/* gcoll-info: prints the version, the transports built and usable here, and every
 * configuration variable with its value, default and help (as ucx_info -c and fi_info -e). */
#include <stdio.h>
#include <string.h>

#include "gcoll.h"

static void usage(void)
{
    printf("usage: gcoll-info [-c] [-t] [--version] [-h]\n"
           "  (no flag)  everything\n"
           "  -c         configuration variables only\n"
           "  -t         transports only\n"
           "  --version  the library's version only\n"
           "exit status 1 when a GCOLL_* variable is invalid\n");
}

static void print_transports(void)
{
    char built[64];
    snprintf(built, sizeof(built), "%s", gcoll_transports_built());
    printf("# transports (built: %s)\n", built);
    const char *all[] = {"tcp", "ucx", "verbs"};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        char why[256] = "";
        gcoll_status_t st = gcoll_transport_probe(all[i], why, sizeof(why));
        printf("%-6s %s%s%s\n", all[i], st == GCOLL_OK ? "usable" : "unavailable",
               st == GCOLL_OK ? "" : ": ", st == GCOLL_OK ? "" : why);
    }
}

static int print_config(void)
{
    printf("# configuration (environment variables)\n");
    const char *last = NULL;
    for (size_t i = 0; i < gcoll_param_count(); i++) {
        gcoll_param_info_t p;
        if (gcoll_param_get(i, &p) != GCOLL_OK)
            continue;
        const char *component = gcoll_param_component(i);
        if (component && (!last || strcmp(component, last) != 0))
            printf("# %s\n", component);
        last = component;
        char why[512];
        int bad = gcoll_param_validate(i, why, sizeof(why)) != GCOLL_OK;
        if (bad) /* as init would refuse it: the default is not what runs */
            printf("%s=%s (invalid)\n", p.name, p.value);
        else
            printf("%s=%s\n", p.name, p.value ? p.value : p.deflt);
        printf("    %s; type %s; default '%s'%s\n", p.help, p.type, p.deflt,
               bad       ? "; INVALID in the environment: gcoll_comm_init fails"
               : p.value ? "; set in the environment"
                         : "");
        if (bad)
            printf("    error: %s\n", why);
    }
    char err[512];
    if (gcoll_param_check(err, sizeof(err)) != GCOLL_OK) {
        printf("# error: %s\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int config = 1, transports = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0)
            transports = 0;
        else if (strcmp(argv[i], "-t") == 0)
            config = 0;
        else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("gcoll %s\n", gcoll_version());
            return 0;
        } else {
            usage();
            return strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    printf("# gcoll %s\n", gcoll_version());
    if (transports)
        print_transports();
    return config ? print_config() : 0;
}
