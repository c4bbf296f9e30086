/*
 * Internal: dsv4_dist_forward with the rows' device named by the caller (not installed). The
 * public call takes the device of the plan's backend's stages (cuda), or none; the tests name a
 * host-memory stand-in to run the device path (run_chunk with its rows on a device) in CI next to
 * the host path.
 */
#ifndef DSV4MOE_FAST_MULTIRANK_DRIVER_IMPL_H
#define DSV4MOE_FAST_MULTIRANK_DRIVER_IMPL_H

#include "dsv4moe/dist.h"
#include "fast/backend/backend_impl.h"

/* device: the rows' device and its communicator for every rank; NULL: dsv4_dist_forward's choice. */
dsv4_status dsv4_dist_forward_on(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                                 const dsv4_budget *budget, const dsv4_dist_options *opt,
                                 const dsv4_backend_device *device, dsv4_dist_rank *ranks, dsv4_error *err);

#endif
