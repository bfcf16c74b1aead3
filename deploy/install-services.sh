#!/usr/bin/env bash
# The distributed stack's system services, from Debian's packages: PostgreSQL, Redis, Chromium (the UI
# screenshots) and acl (setfacl: as root, `up` lets the workers' OS users traverse a closed folder above the
# Python interpreter, deploy/isolation.py). Installs only what is missing, so it is a no-op on a prepared
# machine; needs root (or sudo) when something is missing. The Debian packages start no service here: deploy/stack.py runs its own
# PostgreSQL cluster and Redis, bound to 127.0.0.1, under the stack's home.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/postgres > /dev/null 2>&1 || missing+=(postgresql)
command -v redis-server > /dev/null || missing+=(redis-server)
command -v chromium > /dev/null || missing+=(chromium)
command -v setfacl > /dev/null || missing+=(acl)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "installing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo > /dev/null || { echo "error: run as root to install ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
# policy-rc.d: keep apt from starting the packaged services (the stack runs its own, on its own ports);
# a policy the machine already has is left as it is
if [ ! -e /usr/sbin/policy-rc.d ]; then
    $SUDO sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
