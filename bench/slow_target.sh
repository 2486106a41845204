#!/usr/bin/env bash
# A slow target directory for tsnap_bench_tier: an ext4 filesystem on a loop device whose
# writes are throttled by the block layer (cgroup v1 blkio.throttle.write_bps_device in the root
# cgroup, or cgroup v2 io.max where that is what the machine has), so O_DIRECT writes,
# writeback and fsync all go through the same limit. Needs root.
#   bench/slow_target.sh up   IMAGE MOUNTPOINT [BYTES_PER_SECOND (default 100 MiB/s)] [SIZE (6G)]
#   bench/slow_target.sh down IMAGE MOUNTPOINT
set -euo pipefail
cmd=${1:?up or down}; image=${2:?image file}; mnt=${3:?mount point}
case "$cmd" in
  up)
    rate=${4:-104857600}; size=${5:-6G}
    truncate -s "$size" "$image"
    loop=$(losetup -f --show "$image")
    mkfs.ext4 -q -F "$loop"
    mkdir -p "$mnt" && mount "$loop" "$mnt"
    majmin=$(lsblk -no MAJ:MIN "$loop" | tr -d ' ')
    if [[ -e /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device ]]; then
      echo "$majmin $rate" > /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device
    elif [[ -e /sys/fs/cgroup/io.max ]]; then
      echo "$majmin wbps=$rate" > /sys/fs/cgroup/io.max
    else
      echo "slow_target: no blkio throttle here (cgroup v1 blkio or v2 io.max)" >&2; exit 1
    fi
    echo "$loop ($majmin) mounted on $mnt, writes limited to $rate bytes/s"
    ;;
  down)
    loop=$(findmnt -no SOURCE "$mnt")
    majmin=$(lsblk -no MAJ:MIN "$loop" | tr -d ' ')
    if [[ -e /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device ]]; then
      echo "$majmin 0" > /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device
    fi
    umount "$mnt"; losetup -d "$loop"; rm -f "$image"
    ;;
  *) echo "slow_target: up or down" >&2; exit 2 ;;
esac
