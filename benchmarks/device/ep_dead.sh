export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part dead --out $OUT/dead.json > $OUT/dead.log 2>&1
echo rc=$?
grep -v "^\s*$" $OUT/dead.log | grep -v "OMP_NUM\|\*\*\*\*" | head -80 | cut -c1-300
