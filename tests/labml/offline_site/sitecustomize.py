"""Loaded by every Python process the labml corpus tests start (this folder is first on their PYTHONPATH): any
attempt to reach a host other than the loopback one is refused and recorded, so a test that runs labml code fails
on a download instead of depending on the network.

Each attempt is one JSON line ``[function, host]`` appended to the file ``$LAZYLAB_NETWORK_LOG``; the refusal is
the ``socket.gaierror`` an unreachable name gives, so the code under test fails the way it would offline.
"""
import json
import os
import socket

_LOOPBACK = {'localhost', '127.0.0.1', '::1', 'ip6-localhost', ''}


def _outside(host) -> bool:
    if host is None or isinstance(host, int):
        return False
    name = host.decode() if isinstance(host, bytes) else str(host)
    return name not in _LOOPBACK and not name.startswith('127.')


def _refuse(function: str, host) -> None:
    log = os.environ.get('LAZYLAB_NETWORK_LOG')
    if log:
        with open(log, 'a', encoding='utf-8') as f:
            f.write(json.dumps([function, str(host)]) + '\n')
    raise socket.gaierror(socket.EAI_NONAME, f'outside network refused by the test ({host})')


def _guard_lookup(name: str) -> None:
    real = getattr(socket, name)

    def guarded(host, *args, **kwargs):
        if _outside(host):
            _refuse(name, host)
        return real(host, *args, **kwargs)

    setattr(socket, name, guarded)


def _guard_connect(name: str) -> None:
    real = getattr(socket.socket, name)

    def guarded(self, address, *args, **kwargs):
        if isinstance(address, tuple) and _outside(address[0]):
            _refuse(f'socket.{name}', address[0])
        return real(self, address, *args, **kwargs)

    setattr(socket.socket, name, guarded)


for _name in ('getaddrinfo', 'gethostbyname', 'gethostbyname_ex'):
    _guard_lookup(_name)
for _name in ('connect', 'connect_ex'):
    _guard_connect(_name)
