#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1 for the tests and benchmarks of PostgresStore.
#
#   eval "$(scripts/postgres.sh start)"   start one; exports AGENT_FSM_POSTGRES_URL and
#                                         AGENT_FSM_POSTGRES_DIR
#   scripts/postgres.sh stop [DIR]        stop it and delete its directory
#                                         (default: $AGENT_FSM_POSTGRES_DIR)
#   scripts/postgres.sh env [DIR]         print the export lines of a running one
#
# start's options:
#   --dir DIR      where the cluster lives (default: a new temporary directory)
#   --port PORT    the port (default: a free one)
#   --watch PID    stop the cluster by itself once process PID has exited (the test suite
#                  starts one for its own session this way: no cluster outlives it)
#   --no-install   never install PostgreSQL; fail when it is missing
#
# Uses Debian's PostgreSQL (initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin);
# as root on a machine without them it installs them (apt-get install postgresql). The
# server refuses to run as root, so as root the cluster runs as the `postgres` system user
# (created when missing). It listens on 127.0.0.1 only, with a random password, and its
# socket in its own directory, so it never meets another cluster. Nothing is left behind by
# `stop`: the directory holds the data, the log and the password.
set -euo pipefail

SCRIPT=$(readlink -f "$0")
DATABASE=agent_fsm
SUPERUSER=postgres
OS_USER=postgres

die() {
    echo "postgres.sh: $*" >&2
    exit 1
}

bindir() {
    # The directory holding initdb, pg_ctl and createdb of one PostgreSQL version.
    local found
    if found=$(command -v pg_ctl) && command -v initdb >/dev/null; then
        found=$(dirname "$(readlink -f "$found")")
        if [ -x "$found/initdb" ] && [ -x "$found/createdb" ]; then
            echo "$found"
            return
        fi
    fi
    found=$(find /usr/lib/postgresql -maxdepth 3 -path '*/bin/pg_ctl' 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] && dirname "$found"
}

install_postgres() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        || die "PostgreSQL's server programs (initdb, pg_ctl) are missing: install them" \
            "(apt-get install postgresql), or set AGENT_FSM_POSTGRES_URL to a database"
    echo "postgres.sh: installing PostgreSQL from Debian's packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

as_owner() {
    # Run a server program as the cluster's owner: root cannot run it.
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$OS_USER" -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

print_env() {
    local dir=$1
    [ -f "$dir/url" ] || die "no cluster in $dir"
    printf "export AGENT_FSM_POSTGRES_URL='%s'\n" "$(cat "$dir/url")"
    printf "export AGENT_FSM_POSTGRES_DIR='%s'\n" "$dir"
}

start() {
    local dir="" port="" watch="" install=1
    while [ $# -gt 0 ]; do
        case $1 in
            --dir) dir=$2; shift 2 ;;
            --port) port=$2; shift 2 ;;
            --watch) watch=$2; shift 2 ;;
            --no-install) install=0; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    local bin
    bin=$(bindir) || true
    if [ -z "$bin" ]; then
        [ "$install" = 1 ] || die "PostgreSQL's server programs (initdb, pg_ctl) are missing"
        install_postgres
        bin=$(bindir) || die "PostgreSQL was installed but initdb/pg_ctl are still not found"
    fi
    if [ "$(id -u)" = 0 ] && ! id "$OS_USER" >/dev/null 2>&1; then
        useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin "$OS_USER"
    fi
    if [ -z "$dir" ]; then
        dir=$(mktemp -d "${TMPDIR:-/tmp}/agent-fsm-pg.XXXXXX")
    fi
    mkdir -p "$dir"
    dir=$(readlink -f "$dir")
    [ -e "$dir/data" ] && die "$dir already holds a cluster"
    local password
    password=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    printf '%s\n' "$password" >"$dir/password"
    chmod 600 "$dir/password"
    [ "$(id -u)" = 0 ] && chown -R "$OS_USER" "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U "$SUPERUSER" -A scram-sha-256 \
        --pwfile="$dir/password" -E UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    # A port picked as free may be taken before the server binds it: try a few.
    local attempt
    for attempt in 1 2 3 4 5; do
        local try_port=${port:-$(free_port)}
        if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
            -o "-h 127.0.0.1 -p $try_port -k $dir" start >/dev/null; then
            port=$try_port
            break
        fi
        [ -n "$port" ] || [ "$attempt" = 5 ] && { cat "$dir/server.log" >&2; die "the server did not start"; }
    done
    PGPASSWORD=$password "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$SUPERUSER" "$DATABASE"
    (umask 077 && printf 'postgresql://%s:%s@127.0.0.1:%s/%s\n' "$SUPERUSER" "$password" "$port" "$DATABASE" >"$dir/url")
    echo "$bin" >"$dir/bindir"
    if [ -n "$watch" ]; then
        # Detached, with no file descriptor of the caller: a caller that reads our output
        # must not wait for the watcher.
        setsid bash "$SCRIPT" _watch "$watch" "$dir" </dev/null >/dev/null 2>&1 &
    fi
    print_env "$dir"
}

stop() {
    local dir=${1:-${AGENT_FSM_POSTGRES_DIR:-}}
    [ -n "$dir" ] || die "stop which cluster? give its directory (or set AGENT_FSM_POSTGRES_DIR)"
    [ -d "$dir" ] || return 0
    # Only ever delete a directory this script made.
    [ -f "$dir/bindir" ] && [ -f "$dir/data/PG_VERSION" ] || die "$dir is not a cluster made by postgres.sh"
    as_owner "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}

watch() {
    local pid=$1 dir=$2
    while [ -d "/proc/$pid" ]; do
        sleep 1
    done
    stop "$dir"
}

command=${1:-}
[ $# -gt 0 ] && shift
case $command in
    start) start "$@" ;;
    stop) stop "$@" ;;
    env) print_env "${1:-${AGENT_FSM_POSTGRES_DIR:-}}" ;;
    _watch) watch "$@" ;;
    *) die "usage: $0 start [--dir DIR] [--port PORT] [--watch PID] [--no-install] | stop [DIR] | env [DIR]" ;;
esac
