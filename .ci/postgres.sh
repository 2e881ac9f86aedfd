#!/usr/bin/env bash
# Install (Debian packages) and start a PostgreSQL server on loopback for the tests, create a
# database and a user for them, and print the line that points the tests at it:
#
#     eval "$(.ci/postgres.sh)"     # exports SKETCHWALK_TEST_PG_URL
#
# Idempotent: a second call reuses the running cluster, user and database. Logs go to stderr,
# only the export line to stdout. Needs root (apt-get, pg_ctlcluster) unless the server is
# already installed and running. Settings: SKETCHWALK_PG_PORT (default 5432),
# SKETCHWALK_PG_DB (sketchwalk_test), SKETCHWALK_PG_USER / SKETCHWALK_PG_PASSWORD (sketchwalk).
set -euo pipefail

PORT="${SKETCHWALK_PG_PORT:-5432}"
DB="${SKETCHWALK_PG_DB:-sketchwalk_test}"
USER_NAME="${SKETCHWALK_PG_USER:-sketchwalk}"
PASSWORD="${SKETCHWALK_PG_PASSWORD:-sketchwalk}"

log() { echo "postgres.sh: $*" >&2; }

if ! command -v pg_lsclusters >/dev/null 2>&1; then
    log "installing postgresql (Debian packages)"
    if [ "$(id -u)" -ne 0 ]; then
        log "error: postgresql is not installed and this is not root; apt-get install postgresql"
        exit 1
    fi
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi

VERSION="$(ls /usr/lib/postgresql | sort -n | tail -1)"
CLUSTER=main
if ! pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {f=1} END {exit !f}'; then
    log "creating cluster $VERSION/$CLUSTER on port $PORT"
    pg_createcluster --port "$PORT" "$VERSION" "$CLUSTER" >&2
fi
CLUSTER_PORT="$(pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $3}')"
if [ "$CLUSTER_PORT" != "$PORT" ]; then
    log "cluster $VERSION/$CLUSTER is configured for port $CLUSTER_PORT; using that"
    PORT="$CLUSTER_PORT"
fi
STATUS="$(pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $4}')"
if [ "$STATUS" != "online" ]; then
    log "starting PostgreSQL $VERSION/$CLUSTER on 127.0.0.1:$PORT"
    # Loopback only: the tests never need the server reachable from elsewhere.
    pg_ctlcluster "$VERSION" "$CLUSTER" start -- -o "-c listen_addresses=127.0.0.1" >&2 ||
        pg_ctlcluster "$VERSION" "$CLUSTER" start >&2
fi

psql_admin() { (cd / && su postgres -c "psql -p $PORT -v ON_ERROR_STOP=1 -qtA $*"); }

for _ in $(seq 1 30); do
    psql_admin "-c 'SELECT 1'" >/dev/null 2>&1 && break
    sleep 1
done
psql_admin "-c 'SELECT 1'" >/dev/null

if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = '$USER_NAME'\"")" != "1" ]; then
    log "creating user $USER_NAME"
    psql_admin "-c \"CREATE ROLE $USER_NAME LOGIN PASSWORD '$PASSWORD'\"" >&2
fi
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = '$DB'\"")" != "1" ]; then
    log "creating database $DB"
    psql_admin "-c \"CREATE DATABASE $DB OWNER $USER_NAME\"" >&2
fi

URL="postgresql://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/$DB"
log "ready: $URL"
echo "export SKETCHWALK_TEST_PG_URL=$URL"
