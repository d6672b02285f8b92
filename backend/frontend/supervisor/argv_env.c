/* Preloaded into tritonserver by the supervisor (backend/frontend/supervisor/, LD_PRELOAD): before main() reads its
 * arguments, each "@SPECSERVE_ARG_<NAME>@" in them is replaced by the environment variable
 * SPECSERVE_ARG_<NAME>, which is then removed (with LD_PRELOAD, so Triton's children see neither).
 *
 * Why: Triton 2.51 takes its restricted-API keys and ports only as arguments, and
 * /proc/<pid>/cmdline (what `ps` shows) is readable by every local user, while /proc/<pid>/environ
 * is readable by the same user alone. The kernel shows the original argument strings, which keep
 * the placeholders; main() gets new strings. glibc calls a preloaded library's constructors with
 * (argc, argv, envp) before main().
 *
 * It also ties Triton's life to the launcher's, which cannot do that in the child itself: Python
 * code run in a forked copy of the launcher (subprocess's preexec_fn) can abort the child, since
 * the launcher holds gRPC client threads whose fork handlers then run half-way. So the launcher
 * starts Triton with no Python in the child (vfork + exec) and names itself in
 * SPECSERVE_PARENT_PID; here Triton asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG, however
 * the launcher dies), and dies at once if the launcher is already gone. Not SIGTERM: without its
 * supervisor nobody drains it, and Triton 2.51 hangs when its exit timeout expires with a model still
 * held (an open client stream), keeping the ports. Its stubs and /dev/shm regions are removed by the
 * next start.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define PREFIX "@SPECSERVE_ARG_"

static char *names[32];
static int n_names;

/* `arg` with its placeholders replaced (a new string), or NULL if a variable is missing. */
static char *expand(const char *arg) {
    size_t cap = strlen(arg) + 1, len = 0;
    char *out = malloc(cap);
    const char *p = arg;
    if (!out) return NULL;
    while (*p) {
        const char *start = strstr(p, PREFIX), *end;
        if (!start) start = p + strlen(p);
        size_t plain = (size_t)(start - p);
        char name[128], *value;
        if (len + plain + 1 > cap) { cap = len + plain + 1; out = realloc(out, cap); if (!out) return NULL; }
        memcpy(out + len, p, plain);
        len += plain;
        if (!*start) break;
        end = strchr(start + 1, '@');
        if (!end || (size_t)(end - start - 1) >= sizeof name) { free(out); return NULL; }
        memcpy(name, start + 1, (size_t)(end - start - 1));
        name[end - start - 1] = '\0';
        value = getenv(name);
        if (!value) { free(out); return NULL; }
        if (len + strlen(value) + 1 > cap) { cap = len + strlen(value) + 1; out = realloc(out, cap); if (!out) return NULL; }
        memcpy(out + len, value, strlen(value));
        len += strlen(value);
        if (n_names < 32) names[n_names++] = strdup(name);
        p = end + 1;
    }
    out[len] = '\0';
    return out;
}

static void die_with_parent(void) {
    const char *parent = getenv("SPECSERVE_PARENT_PID");
    if (!parent) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)atol(parent)) raise(SIGKILL);  /* it died before the line above */
    unsetenv("SPECSERVE_PARENT_PID");
}

__attribute__((constructor)) static void specserve_argv_env(int argc, char **argv, char **envp) {
    (void)envp;
    die_with_parent();
    for (int i = 1; i < argc; i++) {
        if (strstr(argv[i], PREFIX)) {
            char *expanded = expand(argv[i]);
            if (expanded) argv[i] = expanded;  /* else left as is: Triton refuses the placeholder */
        }
    }
    for (int i = 0; i < n_names; i++) unsetenv(names[i]);
    unsetenv("LD_PRELOAD");
}
