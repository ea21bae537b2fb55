from sealstream.cli import entrypoint

entrypoint()
