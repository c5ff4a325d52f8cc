#!/usr/bin/env bash
# Lints every CloudFormation/SAM template in infra/ with cfn-lint (installed from PyPI when
# missing). CI calls this; run it locally after editing a template.
#
#   scripts/check-infra.sh
#
# Informational findings (-c I) are treated like warnings: the templates are kept free of them.
# infra/rbac.yaml is a Kubernetes manifest, not a template: tests/tests/infra_rbac.rs checks it.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

if ! command -v cfn-lint >/dev/null 2>&1; then
    echo "check-infra: installing cfn-lint from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check cfn-lint
    hash -r
fi
if ! command -v cfn-lint >/dev/null 2>&1; then
    # pip --user installs land in ~/.local/bin, which may not be on PATH.
    export PATH="$HOME/.local/bin:$PATH"
fi

templates=()
for file in infra/*.yaml infra/*.yml; do
    [ -e "$file" ] || continue
    # A CloudFormation template declares its format version; manifests do not.
    if grep -q '^AWSTemplateFormatVersion:' "$file"; then
        templates+=("$file")
    fi
done
if [ "${#templates[@]}" -eq 0 ]; then
    echo "check-infra: no templates found in infra/" >&2
    exit 1
fi

echo "check-infra: cfn-lint $(cfn-lint --version 2>&1 | awk '{print $NF}') on ${templates[*]}"
# The SAM transform needs a region to resolve pseudo parameters; any region will do for linting.
AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-eu-west-1}" cfn-lint -c I -- "${templates[@]}"
echo "check-infra: ${#templates[@]} templates passed"
