#!/usr/bin/env python3
"""kvsift.cuda.gather_pages against what a PyTorch user writes instead, and the copy limit.

Fetching offloaded KV pages: `count` random pages of a pinned host pool go to random slots of a
device pool. kvsift's kernel reads the pinned pages directly from the GPU in one launch. The
PyTorch way is ``dev[dst] = host[src].to("cuda", non_blocking=True)``: an index_select on the CPU
into a (pageable) staging tensor, a host-to-device copy, then an index_put on the device. The
limit is one contiguous pinned host-to-device copy of the same bytes. All three are timed in one
process with CUDA events (median of 10 after 2 warm-ups) and checked to move the same data.

Usage: page_gather_torch_baseline.py [--host-pages 16384] [--device-pages 4096] [--count 1024]
                                     [--page-size 64] [--dim 128]
"""

import argparse

from cuda_timing import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host-pages", type=int, default=16384)
    ap.add_argument("--device-pages", type=int, default=4096)
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    a = ap.parse_args()
    import torch
    import kvsift.cuda as kc

    shape = (a.page_size, a.dim)
    host = torch.randn(a.host_pages, *shape).half().pin_memory()
    dev = torch.zeros(a.device_pages, *shape, dtype=torch.float16, device="cuda")
    g = torch.Generator().manual_seed(0)
    src = torch.randperm(a.host_pages, generator=g)[: a.count]
    dst = torch.randperm(a.device_pages, generator=g)[: a.count]
    copies = torch.stack([src, dst], dim=1).cuda()
    dst_cuda = dst.cuda()
    flat = host[: a.count].clone().pin_memory()  # the same bytes, contiguous
    staging = torch.empty_like(flat, device="cuda")
    page_bytes = host[0].numel() * host.element_size()
    mb = a.count * page_bytes / 1e6

    def torch_way():
        dev[dst_cuda] = host[src].to("cuda", non_blocking=True)

    ours = median_ms(lambda: kc.gather_pages(copies, host, dev), torch)
    dev.zero_()
    kc.gather_pages(copies, host, dev)
    torch.cuda.synchronize()
    ok = torch.equal(dev[dst_cuda].cpu(), host[src])
    theirs = median_ms(torch_way, torch)
    limit = median_ms(lambda: staging.copy_(flat, non_blocking=True), torch)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}: {a.count} random pages of "
          f"{page_bytes} B ({mb:.1f} MB) from {a.host_pages} pinned host pages to {a.device_pages} "
          f"device pages; median of 10 (CUDA events); same data: {ok}")
    for name, ms in [("kvsift.cuda.gather_pages", ours), ("torch index + .to + index_put", theirs),
                     ("contiguous pinned H2D copy (limit)", limit)]:
        print(f"{name:36s} {ms:8.3f} ms  {mb / ms:8.1f} GB/s  {ms / ours:5.2f}x kvsift's time")


if __name__ == "__main__":
    main()
