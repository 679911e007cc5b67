"""A small Chrome DevTools Protocol client (Python 3 standard library only)
for the end-to-end tests: it starts headless chromium with
--remote-debugging-pipe (commands written to the browser's fd 3, answers
and events read from its fd 4, each message JSON ended by a NUL byte),
opens one page (a flattened session), and offers what a test needs:
navigate and wait for the load, evaluate JavaScript, wait for a condition,
click by CSS selector, screenshots, the page's console errors and uncaught
exceptions, native dialogs accepted (and recorded). `close()` closes the
browser, kills it by PID if it does not exit, and removes its profile.

    with Browser() as browser:
        page = browser.new_page()
        page.navigate("http://127.0.0.1:8080/")
        page.wait_for("document.title === 'arbor'")
        page.click("#button")
        page.screenshot("/tmp/page.png")
        assert not page.errors
"""

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class CDPError(Exception):
    """A protocol error, a timeout, or a browser that went away."""


class Browser:
    """Headless chromium driven over a pipe. `timeout` bounds every command."""

    def __init__(self, binary=CHROMIUM, width=1400, height=900, timeout=30.0):
        self.timeout = timeout
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="arbor-chromium-")
        self.log_path = os.path.join(self.profile, "chromium.log")
        self._next_id = 0
        self._lock = threading.Lock()          # ids, pending, listeners
        self._write_lock = threading.Lock()
        self._pending = {}                     # id -> [event, reply]
        self._listeners = []                   # (session, method, callback)
        self._closed = False
        self.proc = None

        # Our ends and chromium's ends of the two pipes. Chromium's ends are
        # moved to fds >= 10 first, so the redirections below cannot clobber
        # each other whatever numbers os.pipe() gave.
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--no-default-browser-check", "--disable-sync",
                "--mute-audio", "--hide-scrollbars", f"--window-size={width},{height}", "about:blank"]
        # bash (dash takes one-digit fds only) puts the pipe ends on fds 3
        # and 4, closes the originals and execs chromium: the PID stays
        # chromium's (/usr/bin/chromium execs the real binary too).
        script = f'exec "$@" 3<&{child_r} 4>&{child_w} {child_r}<&- {child_w}>&-'
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                ["/bin/bash", "-c", script, "chromium", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(child_r, child_w), start_new_session=True)
        except OSError as e:
            shutil.rmtree(self.profile, ignore_errors=True)
            raise CDPError(f"cannot start {binary}: {e} (Debian package: chromium)") from None
        finally:
            log.close()
            os.close(child_r)
            os.close(child_w)
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()
        try:
            self.version = self.send("Browser.getVersion")
        except CDPError as e:
            log = self.log()
            self.close()
            raise CDPError(f"chromium did not answer on its pipe: {e}\n{log}") from None

    # ---- transport ---------------------------------------------------------

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def _read_loop(self):
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            while True:
                end = buffer.find(b"\0")
                if end < 0:
                    break
                raw, buffer = buffer[:end], buffer[end + 1:]
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                self._dispatch(message)
        # The browser is gone: wake every waiting command.
        self._closed = True
        with self._lock:
            pending = list(self._pending.values())
        for slot in pending:
            slot[1] = {"error": {"message": "the browser closed its pipe"}}
            slot[0].set()

    def _dispatch(self, message):
        if "id" in message:
            with self._lock:
                slot = self._pending.pop(message["id"], None)
            if slot:
                slot[1] = message
                slot[0].set()
            return
        method, session = message.get("method"), message.get("sessionId")
        with self._lock:
            listeners = list(self._listeners)
        for want_session, want_method, callback in listeners:
            if want_method == method and (want_session is None or want_session == session):
                try:
                    callback(message.get("params", {}))
                except Exception as e:  # a listener must not kill the reader
                    print(f"cdp: listener for {method} failed: {e}")

    def on(self, method, callback, session=None):
        with self._lock:
            self._listeners.append((session, method, callback))

    def post(self, method, params=None, session=None):
        """Sends a command without waiting for its answer; returns its id
        (usable from a listener, where waiting would block the reader)."""
        if self._closed:
            raise CDPError(f"{method}: the browser is gone")
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            slot = [threading.Event(), None]
            self._pending[ident] = slot
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        with self._write_lock:
            try:
                self._write_all(data)
            except OSError as e:
                raise CDPError(f"{method}: cannot write to the browser: {e}") from None
        return ident, slot

    def _write_all(self, data):
        view = memoryview(data)
        while view:
            written = os.write(self._to_browser, view)
            view = view[written:]

    def send(self, method, params=None, session=None, timeout=None):
        """A command and its result; raises CDPError on a protocol error or
        when no answer comes within the timeout."""
        ident, slot = self.post(method, params, session)
        if not slot[0].wait(timeout or self.timeout):
            with self._lock:
                self._pending.pop(ident, None)
            raise CDPError(f"{method}: no answer within {timeout or self.timeout:.0f} s")
        reply = slot[1]
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error'].get('message')} {reply['error'].get('data', '')}".rstrip())
        return reply.get("result", {})

    # ---- pages -------------------------------------------------------------

    def new_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, target, session)

    def close(self):
        """Browser.close, then SIGKILL by PID if it has not exited within
        10 s; the profile directory is removed either way."""
        try:
            if self.proc and self.proc.poll() is None and not self._closed:
                try:
                    self.send("Browser.close", timeout=5)
                except CDPError:
                    pass
            if self.proc:
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    try:  # its helpers are in its process group
                        os.killpg(self.proc.pid, 9)
                    except OSError:
                        self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """One tab, attached with a flattened session."""

    def __init__(self, browser, target, session):
        self.browser, self.target, self.session = browser, target, session
        self.errors = []         # console errors, uncaught exceptions, error log entries
        self.dialogs = []        # messages of native dialogs, accepted
        self._loaded = threading.Event()
        b = browser
        b.on("Page.loadEventFired", lambda p: self._loaded.set(), session)
        b.on("Runtime.exceptionThrown", self._exception, session)
        b.on("Runtime.consoleAPICalled", self._console, session)
        b.on("Log.entryAdded", self._log_entry, session)
        b.on("Page.javascriptDialogOpening", self._dialog, session)
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", {
            "width": b.width, "height": b.height, "deviceScaleFactor": 1, "mobile": False})

    def send(self, method, params=None, timeout=None):
        return self.browser.send(method, params, self.session, timeout)

    def _exception(self, params):
        d = params.get("exceptionDetails", {})
        text = (d.get("exception") or {}).get("description") or d.get("text", "exception")
        self.errors.append(f"uncaught exception: {text} at {d.get('url', '')}:{d.get('lineNumber', '?')}")

    def _console(self, params):
        if params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append("console." + params["type"] + ": " + " ".join(map(str, args)))

    def _log_entry(self, params):
        entry = params.get("entry", {})
        if entry.get("level") == "error":
            self.errors.append(f"{entry.get('source', 'log')} error: {entry.get('text', '')} {entry.get('url', '')}".rstrip())

    def _dialog(self, params):
        self.dialogs.append(params.get("message", ""))
        self.browser.post("Page.handleJavaScriptDialog", {"accept": True}, self.session)

    def navigate(self, url, timeout=30.0):
        """Loads url and waits for its load event."""
        self._loaded.clear()
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        if not self._loaded.wait(timeout):
            raise CDPError(f"{url} did not finish loading within {timeout:.0f} s")

    def evaluate(self, expression, await_promise=False, timeout=None):
        """The value of a JavaScript expression (JSON-able values come back
        as Python values); a thrown exception raises CDPError."""
        result = self.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": await_promise,
            "userGesture": True}, timeout)
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            text = (d.get("exception") or {}).get("description") or d.get("text")
            raise CDPError(f"evaluating {expression[:200]!r}: {text}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression, timeout=10.0, what=None, interval=0.05):
        """Polls a JavaScript expression until it is truthy; returns its
        value. Raises CDPError naming `what` (or the expression) and the
        expression's last value on timeout."""
        deadline = time.monotonic() + timeout
        last = None
        # A DOM node does not survive returnByValue: it counts as true.
        probe = f"(v => (v && typeof v === 'object' && v.nodeType) ? true : v)(({expression}))"
        while True:
            try:
                last = self.evaluate(probe)
            except CDPError as e:
                last = f"<{e}>"
            else:
                if last:
                    return last
            if time.monotonic() >= deadline:
                raise CDPError(f"timed out after {timeout:g} s waiting for {what or expression} "
                               f"(last value: {last!r})")
            time.sleep(interval)

    def click(self, selector):
        """Clicks the first element matching selector (scrolled into view);
        raises if there is none or it is disabled."""
        found = self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) return "missing";
            if (el.disabled) return "disabled";
            el.scrollIntoView({{block: "center"}});
            el.click();
            return "ok";
        }})()""")
        if found != "ok":
            raise CDPError(f"cannot click {selector}: {found}")

    def fill(self, selector, value):
        """Sets an input's value as typing would (input event)."""
        found = self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) return false;
            el.focus();
            el.value = {json.dumps(value)};
            el.dispatchEvent(new Event("input", {{bubbles: true}}));
            el.dispatchEvent(new Event("change", {{bubbles: true}}));
            return true;
        }})()""")
        if not found:
            raise CDPError(f"no element {selector} to fill")

    def text(self, selector):
        """The visible text of the first match, or None."""
        return self.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
                             f" return el ? el.innerText : null; }})()")

    def screenshot(self, path, full_page=True, selector=None):
        """Saves a PNG of the page: the whole document when full_page, else
        the viewport, or only the element matching selector."""
        params = {"format": "png"}
        if selector:
            box = self.evaluate(f"""(() => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el) return null;
                const r = el.getBoundingClientRect();
                return {{x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}};
            }})()""")
            if not box:
                raise CDPError(f"no element {selector} to take a screenshot of")
            params.update(captureBeyondViewport=True, clip={**box, "scale": 1})
        elif full_page:
            metrics = self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": max(1, int(size["width"])), "height": max(1, int(size["height"])),
                "scale": 1})
        data = self.send("Page.captureScreenshot", params, timeout=60)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path
