# examples/recipes/flask/shop/serve.py
"""One process for both: werkzeug's WSGI server, and a worker beside it on threads.

`python -m shop.serve 8000`; SIGTERM or SIGINT stops the server, then the
worker (drained within its grace period).
"""

import signal
import sys
import threading

from werkzeug.serving import make_server

from shop.db import get_store
from shop.jobs import HANDLERS
from shop.web import app


def main(port):
    server = make_server("127.0.0.1", port, app, threaded=True)

    def stop(signum, frame):
        # shutdown() waits for serve_forever(), which runs on this very thread
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with get_store().jobs.create_worker(HANDLERS, concurrency=4):  # started; drained on exit
        print(f"serving on http://127.0.0.1:{port}", flush=True)
        server.serve_forever()
    server.server_close()
    get_store().close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8000)
