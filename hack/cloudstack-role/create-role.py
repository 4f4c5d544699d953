#!/usr/bin/env python3
"""Create the read-only CloudStack role capc-health-shim needs, through the raw API.

The same effect as cloudmonkey.txt, for machines without CloudMonkey: a role of type User
that allows exactly the calls the shim makes, then denies everything else (`*` deny). Without
that last rule CloudStack would still allow every API whose annotation lists the User type.

Standard library only. The request signer follows CloudStack's server-side verification
(values encoded like java.net.URLEncoder with space as %20, names sorted case-sensitively,
the whole string lowercased, HMAC-SHA1, base64), with signatureversion=3 and a short
`expires` in the `+0000` form every CloudStack release accepts.

Environment (admin keys; the role is created with them, they are never printed):
  CLOUDSTACK_API_URL     e.g. https://cloud.example.com/client/api
  CLOUDSTACK_API_KEY
  CLOUDSTACK_SECRET_KEY
  CLOUDSTACK_VERIFY_SSL  "false" to skip TLS verification (default: verify)

The opt-in guest probe (docs/guest-probe.md) needs a second, separate key: `--probe` creates
its role instead, of type Admin (runDiagnostics is annotated for Admin only, and only Admin
callers may pass its `params`), allowing exactly listRouters, runDiagnostics and
queryAsyncJobResult, then denying everything else. The final deny matters even more here: an
Admin-type role without it may call every Admin API (DynamicRoleBasedAPIAccessChecker falls
back to the command's annotation when no rule matches).

Usage:
  create-role.py [--name capc-health-shim-ro] [--dry-run]
  create-role.py --probe [--name capc-health-shim-probe] [--dry-run]
  create-role.py --call listApis name=listVirtualMachines   # one signed call, prints the JSON

Exit codes: 0 done, 1 CloudStack refused a call or the role exists already, 2 usage/environment.
"""

import argparse
import base64
import datetime
import hashlib
import hmac
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request

ROLE_NAME = "capc-health-shim-ro"
ROLE_TYPE = "User"
ROLE_DESCRIPTION = "capc-health-shim: read-only VM health (list calls only)"

# The calls capc-health-shim makes, in the order the rules are created; then `*` deny.
ALLOWED = [
    "listVirtualMachines",
    "listVirtualMachinesMetrics",
    "listVirtualMachinesUsageHistory",
    "listNics",
    "listCapabilities",
    "listApis",
    # The remnant report: the error of a VM's last failed destroy (docs/orphans.md).
    "listAsyncJobs",
]
RULES = [(api, "allow") for api in ALLOWED] + [("*", "deny")]

PROBE_ROLE_NAME = "capc-health-shim-probe"
PROBE_ROLE_TYPE = "Admin"
PROBE_ROLE_DESCRIPTION = "capc-health-shim guest probe: arping from virtual routers (runDiagnostics) only"

# The calls the guest probe makes, in the order the rules are created; then `*` deny.
PROBE_ALLOWED = [
    "listRouters",
    "runDiagnostics",
    "queryAsyncJobResult",
]
PROBE_RULES = [(api, "allow") for api in PROBE_ALLOWED] + [("*", "deny")]

# java.net.URLEncoder leaves exactly these unescaped (space becomes '+', sent as %20).
_SAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-*_"
EXPIRES_AFTER = datetime.timedelta(minutes=5)
DRY_RUN_ROLE_ID = "ROLE_ID"


_SAFE_BYTES = frozenset(_SAFE.encode())


def encode_value(value):
    """A value as java.net.URLEncoder encodes it (UTF-8), space as %20. Not urllib's quote:
    that always leaves `~` raw, which CloudStack encodes (and then rejects the signature)."""
    return "".join(chr(b) if b in _SAFE_BYTES else f"%{b:02X}" for b in str(value).encode())


def canonical_string(params):
    """The string CloudStack signs: every parameter except `signature`, names raw and
    sorted case-sensitively, values encoded, joined with '&', then lowercased."""
    pairs = sorted((k, v) for k, v in params.items() if k.lower() != "signature")
    return "&".join(f"{k}={encode_value(v)}" for k, v in pairs).lower()


def signature(secret, params):
    digest = hmac.new(secret.encode(), canonical_string(params).encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def signed_query(secret, params):
    """The query string to send: sorted pairs (values encoded, case kept), then the signature."""
    pairs = sorted(params.items())
    query = "&".join(f"{k}={encode_value(v)}" for k, v in pairs)
    return f"{query}&signature={encode_value(signature(secret, params))}"


def expires_at(now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return (now + EXPIRES_AFTER).strftime("%Y-%m-%dT%H:%M:%S+0000")


def request_params(api_key, command, args, now=None):
    params = {
        "apiKey": api_key,
        "command": command,
        "response": "json",
        "signatureversion": "3",
        "expires": expires_at(now),
    }
    params.update({k: str(v) for k, v in args.items()})
    return params


class ApiError(Exception):
    def __init__(self, command, status, body):
        self.command, self.status, self.body = command, status, body
        text = body
        try:
            inner = next(iter(json.loads(body).values()))
            text = f"{inner.get('errorcode')}: {inner.get('errortext')}"
        except (ValueError, StopIteration, AttributeError):
            pass
        super().__init__(f"{command}: HTTP {status}: {text}")


class Client:
    def __init__(self, url, api_key, secret, verify_ssl=True, timeout=30):
        self.url, self.api_key, self.secret, self.timeout = url, api_key, secret, timeout
        self.context = None
        if not verify_ssl:
            self.context = ssl.create_default_context()
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE

    def request_url(self, command, **args):
        query = signed_query(self.secret, request_params(self.api_key, command, args))
        return f"{self.url}?{query}"

    def call(self, command, **args):
        """Sends one signed GET; returns the response object (the `…response` member)."""
        req = urllib.request.Request(self.request_url(command, **args), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                body = resp.read().decode()
        except urllib.error.HTTPError as e:
            raise ApiError(command, e.code, e.read().decode(errors="replace")) from None
        data = json.loads(body)
        return next(iter(data.values())) if data else {}


def redacted(url):
    """A request URL for printing: the API key replaced by API_KEY. The signature stays (it
    proves nothing without the key and expires with `expires`); the secret never appears."""
    base, _, query = url.partition("?")
    pairs = ["apiKey=API_KEY" if kv.lower().startswith("apikey=") else kv for kv in query.split("&")]
    return f"{base}?{'&'.join(pairs)}"


def create_role(client, name, dry_run=False, out=sys.stdout, probe=False):
    """createRole, then one createRolePermission per rule, in order. In a dry run, prints the
    signed requests instead of sending them (the role id is shown as ROLE_ID). `probe`: the
    guest probe's Admin-type role instead of the read-only one."""
    role_type, description, rules = (
        (PROBE_ROLE_TYPE, PROBE_ROLE_DESCRIPTION, PROBE_RULES)
        if probe
        else (ROLE_TYPE, ROLE_DESCRIPTION, RULES)
    )
    steps = [("createRole", {"name": name, "type": role_type, "description": description})]
    for rule, permission in rules:
        steps.append(
            (
                "createRolePermission",
                {"roleid": None, "rule": rule, "permission": permission,
                 "description": f"capc-health-shim: {permission} {rule}"},
            )
        )
    if dry_run:
        for command, args in steps:
            args = {k: (DRY_RUN_ROLE_ID if v is None else v) for k, v in args.items()}
            print(f"GET {redacted(client.request_url(command, **args))}", file=out)
        return DRY_RUN_ROLE_ID
    existing = client.call("listRoles", name=name).get("role", [])
    if any(r.get("name") == name for r in existing):
        raise SystemExit(f"role {name!r} exists already; remove it or pick another --name")
    role = client.call(steps[0][0], **steps[0][1])
    role_id = role.get("role", role).get("id")
    if not role_id:
        raise SystemExit(f"createRole answered without an id: {role}")
    print(f"created role {name} ({role_id})", file=out)
    for command, args in steps[1:]:
        client.call(command, **{**args, "roleid": role_id})
        print(f"  {args['permission']:5} {args['rule']}", file=out)
    return role_id


def client_from_env(env=os.environ):
    missing = [k for k in ("CLOUDSTACK_API_URL", "CLOUDSTACK_API_KEY", "CLOUDSTACK_SECRET_KEY") if not env.get(k)]
    if missing:
        _usage_exit(f"set {', '.join(missing)} (admin keys)")
    return Client(
        env["CLOUDSTACK_API_URL"],
        env["CLOUDSTACK_API_KEY"],
        env["CLOUDSTACK_SECRET_KEY"],
        verify_ssl=env.get("CLOUDSTACK_VERIFY_SSL", "true").lower() != "false",
    )


def _usage_exit(message):
    print(f"create-role.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description="Create the read-only CloudStack role for capc-health-shim.")
    p.add_argument("--name", help=f"role name (default {ROLE_NAME}, with --probe {PROBE_ROLE_NAME})")
    p.add_argument("--probe", action="store_true",
                   help="create the guest probe's Admin-type role (listRouters, runDiagnostics, queryAsyncJobResult) instead")
    p.add_argument("--dry-run", action="store_true", help="print the signed requests, send nothing")
    p.add_argument("--call", nargs="+", metavar=("COMMAND", "NAME=VALUE"),
                   help="send one signed call with these keys and print the JSON answer (e.g. to check a key)")
    args = p.parse_args(argv)
    client = client_from_env()
    try:
        if args.call:
            command, pairs = args.call[0], args.call[1:]
            if any("=" not in kv for kv in pairs):
                _usage_exit("--call parameters must be NAME=VALUE")
            result = client.call(command, **dict(kv.split("=", 1) for kv in pairs))
            print(json.dumps(result, indent=2, sort_keys=True))
            return 0
        name = args.name or (PROBE_ROLE_NAME if args.probe else ROLE_NAME)
        create_role(client, name, dry_run=args.dry_run, probe=args.probe)
        return 0
    except ApiError as e:
        print(f"create-role.py: CloudStack refused {e}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"create-role.py: cannot reach {client.url}: {e.reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
