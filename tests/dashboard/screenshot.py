"""Take a screenshot of a dashboard page with the system Chromium (how docs/ gets its pictures).

    python -m tests.dashboard.screenshot http://127.0.0.1:8090/stagesets/shop/shop docs/images/x.png

``--width`` sets the viewport (390 for a phone); the whole page is captured.
"""

from __future__ import annotations

import argparse
import time

from tests.dashboard.browser import chromium


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=700)
    parser.add_argument("--wait", type=float, default=1.5, help="seconds for the live stream to connect")
    parser.add_argument("--full-page", action="store_true")
    options = parser.parse_args()
    with chromium() as browser:
        page = browser.new_page(
            viewport={"width": options.width, "height": options.height}, device_scale_factor=1
        )
        page.goto(options.url)
        page.wait_for_selector("#live[data-state=on]", timeout=15_000)
        time.sleep(options.wait)
        page.screenshot(path=options.out, full_page=options.full_page)
    print(options.out)


if __name__ == "__main__":
    main()
