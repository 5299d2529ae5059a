"""The running `berth cas serve`: the configured store, the installation's key, uvicorn.

The key is derived from the secret key as the servers find it (BERTH_SECRET_KEY, else
$BERTH_HOME/secret.key), so every server and worker of the installation can present it and no
tenant ever holds it. TLS comes from [network] tls, as for `berth serve`.
"""

import structlog
import uvicorn

from service import log
from service.api import cas_serve
from service.config import Config, home
from service.domain import secrets
from service.domain.artifacts import server_store

logger = structlog.get_logger("berth.cas")


def main(cfg: Config, *, host: str, port: int) -> int:
    log.configure()
    berth_home = home()
    key = secrets.load_key(berth_home)
    server = server_store.open_server_store(cfg, home=berth_home, secret_key=key)
    app = cas_serve.create_app(server, key=server_store.serve_key(key))
    tls = cfg.network.tls
    certfile, keyfile = (None, None) if isinstance(tls, str) else (tls.cert, tls.key)
    logger.info("cas_serving", listen=f"{host}:{port}", provider=cfg.cas.provider)
    uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            lifespan="off",
            http="httptools",
            loop="uvloop",
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
        )
    ).run()
    return 0
