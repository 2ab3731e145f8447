"""``rollbox images ls | import PATH [--name NAME] | prefetch REF | rm REF``."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from rollbox.cli_commands import Command

from rollbox_local.images import Image, ImageInfo, ImageStore


def image_commands() -> list[Command]:
    return [Command("images", "Manage the local backend's image store: list, import, "
                    "prefetch and remove images.", configure, run)]


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="images_action", metavar="ACTION", required=True)
    ls = sub.add_parser("ls", help="list stored images: names, digest, size, pins, last use")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    imp = sub.add_parser(
        "import", help="unpack an image now: an OCI layout (dir or tar), a docker save "
        "tar or a rootfs directory (prefix oci:, docker-archive: or dir: to force a format)")
    imp.add_argument("path", help="the image's file or directory (registries are not read: "
                     "`docker save` or `skopeo copy` it to a file first)")
    imp.add_argument("--name", help="name to refer to it by (default: its path)")
    pre = sub.add_parser("prefetch", help="hydrate an image (a name or path) ahead of need")
    pre.add_argument("ref", help="a name from `rollbox images ls`, or a path as for import")
    rm = sub.add_parser("rm", help="delete a stored image (refused while a sandbox uses it)")
    rm.add_argument("ref", help="a name, path or digest from `rollbox images ls`")


def run(args: argparse.Namespace) -> int:
    store = ImageStore.default()
    action: str = args.images_action
    if action == "ls":
        _print_list(store.list(), store.capacity_bytes, as_json=args.json)
    elif action == "import":
        _print_image(store.import_path(args.path, args.name))
    elif action == "prefetch":
        _print_image(asyncio.run(_prefetch(store, args.ref)))
    elif action == "rm":
        store.remove(args.ref)
        print(f"removed {args.ref}")
    return 0


async def _prefetch(store: ImageStore, ref: str) -> Image:
    try:
        return await store.prefetch(ref)
    finally:
        await store.aclose()


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _print_image(image: Image) -> None:
    base = " (over host)" if image.on_host else ""
    print(f"{image.ref}\t{image.digest}\t{_size(image.size_bytes)}{base}")


def _print_list(infos: list[ImageInfo], capacity: int, *, as_json: bool) -> None:
    if as_json:
        for info in infos:
            print(json.dumps({"refs": list(info.refs), "digest": info.digest,
                              "size_bytes": info.size_bytes, "pinned": info.pinned,
                              "last_used": info.last_used, "on_host": info.on_host}))
        return
    rows = [("REF", "DIGEST", "SIZE", "PINNED", "LAST USED")]
    for info in infos:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.last_used))
        rows.append((", ".join(info.refs) or "-", info.digest[:19], _size(info.size_bytes),
                     str(info.pinned), used))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    total = sum(i.size_bytes for i in infos)
    print(f"{len(infos)} image(s), {_size(total)} of {_size(capacity)} (plus the built-in "
          "'host' image)")
