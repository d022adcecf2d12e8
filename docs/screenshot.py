"""Takes docs/dashboard.png: runs `batchline demo` for a while and photographs its dashboard in
Debian's headless Chromium through chromedriver (the browser the tests use).

    .venv/bin/python docs/screenshot.py [--seconds 45]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--port", type=int, default=4077)
    args = parser.parse_args()
    demo = subprocess.Popen(
        [sys.executable, "-m", "batchline.cli.main", "demo", "--rate", "3000", "--users", "400", "--batch-interval",
         "1s", "--master", "local[2]", "--dashboard-port", str(args.port), "--no-metrics"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{args.port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "api/snapshot", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        time.sleep(args.seconds)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--window-size=1400,1000", f"--user-data-dir={tempfile.mkdtemp()}"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
        try:
            browser.get(url)
            time.sleep(3)
            browser.save_screenshot(str(HERE / "dashboard.png"))
        finally:
            browser.quit()
    finally:
        demo.terminate()
        demo.wait(60)
    print(f"wrote {HERE / 'dashboard.png'}")


if __name__ == "__main__":
    main()
