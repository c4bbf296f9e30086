#!/bin/sh
# Runs build/nccl/test_nccl --world as N ranks on one host (one process per GPU), the way any
# launcher would (DSV4_RANK / DSV4_WORLD_SIZE / DSV4_LOCAL_RANK, a fresh DSV4_NCCL_ID_FILE).
#   tests/nccl/run_world.sh N            numerics, trace identity, bandwidth at ep = N
#   tests/nccl/run_world.sh N missing R  rank R never arrives: every other rank must fail in time
# Exit 0 only if every rank exited 0. Keeps NVLink multicast off.
set -u
n=${1:?usage: run_world.sh N [missing R]}
bin=${DSV4_NCCL_TEST:-build/nccl/test_nccl}
dir=$(mktemp -d /tmp/dsv4-world.XXXXXX)
export NCCL_NVLS_ENABLE=0 DSV4_NCCL_ID_FILE=$dir/id DSV4_WORLD_SIZE=$n
mode="--world"
[ "${2:-}" = missing ] && mode="--world-missing ${3:?missing needs a rank}"
pids=""
r=0
while [ $r -lt $n ]; do
    DSV4_RANK=$r DSV4_LOCAL_RANK=$r timeout 300 $bin $mode > $dir/rank$r.log 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
done
rc=0
for p in $pids; do wait $p || rc=1; done
cat $dir/rank*.log | grep -E "^rank [0-9]+: (PASS|FAIL)"
[ $rc -eq 0 ] && echo "PASS world of $n ($mode)" || echo "FAIL world of $n ($mode): see $dir"
exit $rc
