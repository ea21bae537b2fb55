"""The arguments of every Ray node the tests start (loopback only, no dashboard).

A module of its own: test files import it by a name no other test directory uses
(``from conftest import ...`` would find whichever conftest was imported first)."""

NODE = {"node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": 2}
