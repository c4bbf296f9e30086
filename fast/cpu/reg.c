/*
 * The CPU backend's registration (fast/backend/backend_reg.h): host memory, OpenBLAS and the
 * kernel tables of fast/cpu/kernels/, ranks of sharded plans through its stages, its own memory
 * model (stages.c), and the "kernels" extension (the table an instance runs).
 */
#include <string.h>

#include "fast/backend/backend_reg.h"
#include "fast/cpu/cpu_impl.h"

static dsv4_backend_proc cpu_get_proc(const char *name)
{
    if (!strcmp(name, "kernels"))
        return (dsv4_backend_proc)(dsv4_backend_kernels_fn)dsv4_cpu_backend_kernels;
    return NULL;
}

const dsv4_backend_reg *dsv4_cpu_backend_reg(void)
{
    static const dsv4_backend_reg reg = {
        .name = "cpu",
        .kind = DSV4_BACKEND_CPU,
        .caps = {.sharding = true},
        .workspace_bytes = dsv4_cpu_backend_workspace_bytes,
        .create = dsv4_cpu_backend_create,
        .stages = &dsv4_cpu_backend_stages,
        .get_proc = cpu_get_proc,
        .params = "kernels",
    };
    return &reg;
}
