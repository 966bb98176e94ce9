"""A throwaway certificate authority, made with ``openssl`` (nothing downloaded), for a
ZooKeeper that serves TLS only and the clients that talk to it.

:class:`ThrowawayCa` makes a CA in a directory and issues PEM certificates signed by it: a server's
(with the addresses it is reached at as subject alternative names) and clients' (subject
``/O=zkgroups/CN=<name>``: ZooKeeper's ``X509AuthenticationProvider`` makes that the x509
identity ``CN=<name>,O=zkgroups``), with any validity window (an expired one for tests) and
optionally an encrypted key. Passwords go to ``openssl`` through files, never its command line.
"""
from __future__ import annotations

import datetime
import os
import subprocess
from dataclasses import dataclass
from typing import Optional, Sequence

_CA_CONFIG = """[ca]
default_ca = test
[test]
database = {dir}/index.txt
new_certs_dir = {dir}/issued
serial = {dir}/serial
default_md = sha256
policy = anything
unique_subject = no
email_in_dn = no
[anything]
organizationName = optional
commonName = supplied
"""


@dataclass(frozen=True)
class Issued:
    """A certificate and its key (``pem``: both in one file, as ZooKeeper's PEM key store wants)."""
    cert: str
    key: str
    pem: str
    identity: str  # the x509 id ZooKeeper derives: CN=...,O=zkgroups


def _stamp(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y%m%d%H%M%SZ")


class ThrowawayCa:
    """A CA in ``directory``: ``ca.pem`` (its certificate, every trust store's content)."""

    def __init__(self, directory: str, name: str = "zkgroups test CA"):
        self.dir = directory
        os.makedirs(os.path.join(directory, "issued"), exist_ok=True)
        self.cert, self._key = os.path.join(directory, "ca.pem"), os.path.join(directory, "ca.key")
        self._config = os.path.join(directory, "ca.cnf")
        with open(self._config, "w") as f:
            f.write(_CA_CONFIG.format(dir=directory))
        open(os.path.join(directory, "index.txt"), "w").close()
        with open(os.path.join(directory, "serial"), "w") as f:
            f.write("1000\n")
        self._run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                  "-keyout", self._key, "-out", self.cert, "-days", "30", "-subj", f"/O=zkgroups/CN={name}",
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, name: str, cn: Optional[str] = None, ips: Sequence[str] = (), dns: Sequence[str] = (),
              not_before: Optional[datetime.datetime] = None, not_after: Optional[datetime.datetime] = None,
              password: Optional[str] = None) -> Issued:
        """A certificate ``<name>.pem`` and key ``<name>.key`` for subject ``/O=zkgroups/CN=<cn>``
        (``cn`` defaults to ``name``), valid from ``not_before`` (an hour ago) to ``not_after``
        (in 30 days); ``password`` encrypts the key (AES-256)."""
        cn = cn or name
        now = datetime.datetime.now(datetime.timezone.utc)
        base = os.path.join(self.dir, name)
        key, csr, cert, ext = base + ".key", base + ".csr", base + ".pem", base + ".ext"
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
        self._run("req", "-new", "-key", key, "-out", csr, "-subj", f"/O=zkgroups/CN={cn}")
        sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n" + (f"subjectAltName={','.join(sans)}\n" if sans else ""))
        self._run("ca", "-config", self._config, "-batch", "-notext", "-cert", self.cert, "-keyfile", self._key,
                  "-in", csr, "-out", cert, "-extfile", ext,
                  "-startdate", _stamp(not_before or now - datetime.timedelta(hours=1)),
                  "-enddate", _stamp(not_after or now + datetime.timedelta(days=30)))
        pem = base + ".both.pem"
        with open(pem, "w") as out, open(key) as k, open(cert) as c:
            out.write(k.read() + c.read())
        if password is not None:
            secret = base + ".pass"
            with open(secret, "w") as f:
                f.write(password)
            self._run("pkey", "-in", key, "-out", key + ".enc", "-aes256", "-passout", f"file:{secret}")
            os.replace(key + ".enc", key)
            os.remove(secret)
        return Issued(cert, key, pem, f"CN={cn},O=zkgroups")

    def _run(self, *args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
