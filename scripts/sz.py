"""Print the size of each module (lines), so growth is visible per module in CI output."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARN = 800


def main() -> None:
    rows = []
    for path in sorted((ROOT / "openjarvis").rglob("*.py")):
        lines = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        rows.append((lines, path.relative_to(ROOT).as_posix()))
    total = sum(n for n, _ in rows)
    for lines, name in rows:
        flag = f"  <- over {WARN}, split by concept" if lines > WARN else ""
        print(f"{lines:6d}  {name}{flag}")
    print(f"{total:6d}  total ({len(rows)} modules)")


if __name__ == "__main__":
    main()
