"""NeMo Gym's entrypoint of the rollbox environment server (``rollbox_nemo_gym.server``):
any environment registered through rollbox's ``rollbox_register_tasks``, on rollbox
sandboxes. Put this directory's root on ``NEMO_GYM_EXTRA_ROOTS`` (docs/nemo-gym.md)."""

from rollbox_nemo_gym.server import RollboxResourcesServer

if __name__ == "__main__":
    RollboxResourcesServer.run_webserver()
