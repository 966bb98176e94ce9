"""``groupctl acl apply`` and ``groupctl acl check``: ZooKeeper ACLs of an installation.

    groupctl --zk-auth @admin.secret acl apply --coordinator @coord.secret --group billing=@billing.secret
    groupctl acl check

``apply`` (an admin's identity, given with ``--zk-auth``) writes the policy znode (who is the
coordinator, the admin, each group's identity; whether anyone else may read), then sets on every
existing zkgroups znode the ACL :func:`coordinator.acl.acl_for` gives it. It is idempotent: a
znode whose ACL is already right is not written, and a second run changes nothing. It refuses,
before writing anything, when a group that exists is bound to no identity (its members would be
locked out). A znode the admin may not change (made by someone else with an ACL leaving admins
out) is named, the rest is applied, and the exit status is 1.

``check`` lists the znodes whose ACLs grant more than the policy (an open installation: every
znode anyone may write), one line each, and exits 1 when there is any; znodes whose ACL refuses
a role the policy grants are listed too. Identities are given as ``user:password`` or ``@FILE``
(their digest is computed; nothing secret is stored), as ``digest:user:HASH``, or as a
certificate's x509 identity: ``x509:CN=billing,O=zkgroups`` or ``cert:FILE`` (computed from the
PEM certificate), or as a SASL user: ``sasl:billing``. The admin is the identity ``groupctl``
runs with: ``--zk-auth``, else ``--zk-sasl``, else its TLS client certificate (``--zk-tls-cert``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import click
from kazoo.exceptions import NoAuthError, NoNodeError

from consumer.cli.context import CliContext, pass_cli
from coordinator import acl, protocol
from coordinator.cli.common import CliError, CliGroup, CliUsageError
from coordinator.errors import AuthFailed, ZkGroupsError


def register(main: click.Group) -> None:
    main.add_command(acl_group)


@click.group("acl", cls=CliGroup)
def acl_group() -> None:
    """ZooKeeper ACLs: who may write which znodes (see "Who may do what" in the docs: operations/security)."""


def read_policy(zk) -> Optional[protocol.AclPolicy]:
    """The installation's policy, or None for an open installation."""
    try:
        raw, _ = zk.get(protocol.ACL_POLICY)
    except NoNodeError:
        return None
    except NoAuthError:
        raise AuthFailed(f"this identity may not read the ACL policy ({protocol.ACL_POLICY})") from None
    return protocol.AclPolicy.decode(raw, protocol.ACL_POLICY)


def _bindings(specs: Tuple[str, ...]) -> Dict[str, str]:
    out = {}
    for spec in specs:
        group, eq, identity = spec.partition("=")
        if not eq or not group or not identity:
            raise CliUsageError("--group takes GROUP=IDENTITY (IDENTITY: user:password, @FILE, digest:user:HASH, "
                                "x509:SUBJECT, cert:FILE or sasl:USER)")
        out[protocol.validate_name(group, "group")] = acl.identity_id(identity, f"--group {group}")
    return out


@acl_group.command("apply")
@click.option("--coordinator", "coordinator_identity", metavar="IDENTITY",
              help="The coordinators' identity: user:password, @FILE, digest:user:HASH, x509:SUBJECT, cert:FILE, "
                   "sasl:USER (required the first time).")
@click.option("--group", "groups", multiple=True, metavar="GROUP=IDENTITY",
              help="Bind a group to its members' identity (repeatable; kept across runs).")
@click.option("--world-read/--no-world-read", default=None,
              help="Whether identities outside the policy may read [kept; true the first time].")
@pass_cli
def acl_apply(cli: CliContext, coordinator_identity: Optional[str], groups: Tuple[str, ...],
              world_read: Optional[bool]) -> None:
    """Write the ACL policy and set every zkgroups znode's ACL by it (idempotent)."""
    admin = cli.zk_auth.digest_id if cli.zk_auth is not None else (
        acl.SASL_PREFIX + cli.zk_sasl.user if cli.zk_sasl is not None else (cli.zk_tls.identity if cli.zk_tls else None))
    if admin is None:
        raise CliUsageError("acl apply needs the admin's identity: --zk-auth USER:PASSWORD|@FILE (or ZK_AUTH), "
                            "--zk-sasl, or a TLS client certificate (--zk-tls-cert)")
    bindings = _bindings(groups)
    coordinator = acl.identity_id(coordinator_identity, "--coordinator") if coordinator_identity else None
    zk = cli.zk
    current = read_policy(zk)
    if current is None and coordinator is None:
        raise CliUsageError("this installation has no ACL policy yet: give the coordinators' identity (--coordinator)")
    policy = protocol.AclPolicy(
        coordinator=coordinator or current.coordinator, admin=admin,
        groups={**(current.groups if current else {}), **bindings},
        world_read=world_read if world_read is not None else (current.world_read if current else True))
    unbound = [g for g in _existing_groups(zk) if g not in policy.groups]
    if unbound:
        raise ZkGroupsError(f"groups without an identity: {', '.join(unbound)}; bind each with --group GROUP=IDENTITY "
                            "(their members would be locked out); nothing was changed")
    _write_policy(zk, policy, current)
    zk.acl_policy = policy  # from here on, what this client creates gets the policy's ACLs
    for path in (protocol.BROKER_TOPICS, protocol.COORDINATOR, protocol.GROUPS, protocol.SHARE_GROUPS):
        zk.ensure_path(path)
    changed, refused = 0, []
    for path in acl.znodes(zk):
        expected = acl.acl_for(policy, path)
        try:
            actual, _ = zk.get_acls(path)
            if acl.same_acl(actual, expected):
                continue
            zk.set_acls(path, expected)
            changed += 1
        except NoNodeError:
            continue  # went away meanwhile (an ephemeral node)
        except NoAuthError:
            refused.append(path)
    click.echo(f"ACL policy applied: {changed} znode{'s' * (changed != 1)} changed")
    for path in refused:
        click.echo(f"error: {path}: its ACL leaves admins out; only ZooKeeper's superuser can change it", err=True)
    if refused:
        raise CliError(f"{len(refused)} znode{'s' * (len(refused) != 1)} could not be changed")


def _existing_groups(zk) -> List[str]:
    try:
        return sorted(zk.get_children(protocol.GROUPS))
    except NoNodeError:
        return []


def _write_policy(zk, policy: protocol.AclPolicy, current: Optional[protocol.AclPolicy]) -> None:
    if current is None:
        zk.ensure_path(protocol.ACL_POLICY.rsplit("/", 1)[0])
        zk.create(protocol.ACL_POLICY, policy.encode(), acl=acl.acl_for(policy, protocol.ACL_POLICY))
    elif current != policy:
        zk.set_data(protocol.ACL_POLICY, policy.encode())


@acl_group.command("check")
@pass_cli
def acl_check(cli: CliContext) -> None:
    """List znodes whose ACLs grant more than the policy (exit status 1 when any)."""
    zk = cli.zk
    policy = read_policy(zk)
    problems: List[str] = []
    paths = acl.znodes(zk)
    for path in paths:
        try:
            actual, _ = zk.get_acls(path)
        except NoNodeError:
            continue
        if policy is None:
            extra = acl.weaker(actual, [acl.ACL(acl.R, acl.Id("world", "anyone"))])
        else:
            expected = acl.acl_for(policy, path)
            extra = acl.weaker(actual, expected)
            if acl.missing(actual, expected):
                extra.append("a role the policy allows is refused")
        if extra:
            problems.append(f"{path}: {'; '.join(extra)}")
    if policy is None:
        click.echo(f"open installation: no ACL policy at {protocol.ACL_POLICY} (create it with 'groupctl acl apply')")
    for line in problems:
        click.echo(line)
    click.echo(f"{len(paths)} znodes checked, {len(problems)} not as the policy says" if policy is not None
               else f"{len(paths)} znodes checked, {len(problems)} writable by anyone")
    if problems:
        raise CliError(f"{len(problems)} of {len(paths)} znodes do not match the ACL policy")
