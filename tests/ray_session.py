"""One local Ray, and one Serve instance, for the whole test session, shared by the
modules that need one.

Starting a local Ray (GCS, raylet, dashboard agents) and shutting it down again costs
5-8 s on a 2-core machine, Serve's controller and HTTP proxy a few more; the test modules
that use Ray used to pay both once each. `local_ray()` starts the instance, and Serve on
`SERVE_PORT`, the first time it is entered and leaves them running; on leaving it deletes
every Serve application and kills what the module left behind in the service's
namespace, so every module still starts from an empty cluster. `stop_ray()` ends the
instance (tests that start Ray processes of their own call it first; tests/conftest.py
calls it when the session ends).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

SERVE_PORT = 8123
"""The port of the shared Serve proxy: every test that talks HTTP to a Serve app uses it
(Serve keeps the port it was started on)."""
NUM_CPUS = 16
"""Logical CPUs of the shared instance: the most any module asked for (the actors of the
Serve apps of tests/serve/test_openai_e2e.py); they may exceed the physical ones."""


@contextmanager
def local_ray(fresh: bool = False) -> Iterator[None]:
    """The shared local Ray instance (started if none is connected), in the service's
    namespace, with Serve listening on 127.0.0.1:`SERVE_PORT`; on exit every Serve app is
    deleted and the named actors left in the namespace are killed.

    `fresh`: a private instance instead, started now (after stopping a shared one) and
    stopped on exit, for a module whose Ray processes must see environment variables it
    sets first (Ray's workers inherit the environment of `ray.init`)."""
    import ray
    from ray import serve

    from marconi_ray.serve.settings import NAMESPACE

    if fresh:
        stop_ray()
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=NUM_CPUS,
            include_dashboard=False,
            namespace=NAMESPACE,
            log_to_driver=False,
        )
    serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT})
    try:
        yield
    finally:
        if fresh:
            stop_ray()
        else:
            clean_up()


def clean_up() -> None:
    """Delete every Serve app and kill every named actor left in the service's namespace."""
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    from marconi_ray.serve.settings import NAMESPACE

    if not ray.is_initialized():
        return
    with contextlib.suppress(RayServeException):  # Serve not running
        for app in list(serve.status().applications):
            serve.delete(app)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == NAMESPACE:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(actor["name"], namespace=NAMESPACE))


def stop_ray() -> None:
    """Shut the shared instance down (a no-op when none is connected)."""
    import ray
    from ray import serve

    if ray.is_initialized():
        clean_up()
        serve.shutdown()
        ray.shutdown()
