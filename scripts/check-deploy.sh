#!/usr/bin/env bash
# Checks the CloudFormation template deploy/cloudformation/sluice.yaml, without AWS
# credentials or cargo:
#
#   1. cfn-lint (pinned, installed from PyPI into a virtualenv under the target directory and
#      reused while it holds the pinned version) finds no error, warning or informational
#      finding in it;
#   2. each of its three IAM managed policies has exactly the statements of its file under
#      deploy/iam/ (same Sids, actions in the same order, same resources) once the template's
#      `!Sub` ARNs are written with that directory's REGION/ACCOUNT_ID/TABLE_NAME
#      placeholders, and the reconciler function's role attaches the reconciler policy: the
#      policies a Rust test checks against every DynamoDB operation the suite sends are the
#      ones the template deploys;
#   3. its table is the one `sluice table create` makes: the key, index and TTL attribute
#      names are read from the Rust constants in sluice/src/store/dynamo/row.rs.
#
# Prints one line per check passed; fails at the first that does not.
set -euo pipefail
cd "$(dirname "$0")/.."

CFN_LINT_VERSION="1.58.0"
CFN_LINT_DIR="${CARGO_TARGET_DIR:-target}/cfn-lint"
TEMPLATE=deploy/cloudformation/sluice.yaml

if [ "$("$CFN_LINT_DIR/bin/cfn-lint" --version 2>/dev/null || true)" != "cfn-lint $CFN_LINT_VERSION" ]; then
    echo "installing cfn-lint==$CFN_LINT_VERSION into $CFN_LINT_DIR" >&2
    rm -rf "$CFN_LINT_DIR"
    python3 -m venv "$CFN_LINT_DIR"
    "$CFN_LINT_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
        "cfn-lint==$CFN_LINT_VERSION" >&2
fi

"$CFN_LINT_DIR/bin/cfn-lint" --non-zero-exit-code informational -- "$TEMPLATE"
echo "ok: cfn-lint $CFN_LINT_VERSION finds nothing in $TEMPLATE"

"$CFN_LINT_DIR/bin/python" - "$TEMPLATE" <<'PY'
import difflib
import json
import re
import sys

import yaml

template_path = sys.argv[1]


class Tagged:
    """A CloudFormation short-form function (`!Sub`, `!Ref`, `!GetAtt`, ...) and its argument."""

    def __init__(self, tag, value):
        self.tag, self.value = tag, value

    def __repr__(self):
        return f"{self.tag} {self.value!r}"


class Loader(yaml.SafeLoader):
    pass


def tagged(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return Tagged("!" + suffix, value)


Loader.add_multi_constructor("!", tagged)

with open(template_path) as f:
    template = yaml.load(f, Loader=Loader)
resources = template["Resources"]


def fail(message):
    sys.exit(f"error: {template_path}: {message}")


# What deploy/iam/README.md says to put in place of the placeholders, the other way round.
SUBSTITUTIONS = {
    "AWS::Partition": "aws",
    "AWS::Region": "REGION",
    "AWS::AccountId": "ACCOUNT_ID",
    "Table": "TABLE_NAME",
}


def render(value, where):
    """The value with each `!Sub` string rendered; any other function is an error."""
    if isinstance(value, Tagged):
        if value.tag != "!Sub" or not isinstance(value.value, str):
            fail(f"{where}: only `!Sub \"...\"` strings can be compared with deploy/iam/, found {value!r}")

        def variable(match):
            name = match.group(1)
            if name not in SUBSTITUTIONS:
                fail(f"{where}: `${{{name}}}` in {value.value!r} has no placeholder in deploy/iam/")
            return SUBSTITUTIONS[name]

        return re.sub(r"\$\{([^}!]+)\}", variable, value.value)
    if isinstance(value, dict):
        return {k: render(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


for name, role in [
    ("ApplicationPolicy", "application"),
    ("ReconcilerPolicy", "reconciler"),
    ("OperatorPolicy", "operator"),
]:
    path = f"deploy/iam/{role}.json"
    with open(path) as f:
        expected = json.load(f)
    resource = resources.get(name) or fail(f"no resource {name}")
    if resource.get("Type") != "AWS::IAM::ManagedPolicy":
        fail(f"{name} is not an AWS::IAM::ManagedPolicy")
    document = render(resource["Properties"]["PolicyDocument"], f"{name}.PolicyDocument")
    if document != expected:
        diff = difflib.unified_diff(
            json.dumps(expected, indent=2).splitlines(),
            json.dumps(document, indent=2).splitlines(),
            path,
            f"{name} (rendered)",
            lineterm="",
        )
        fail(f"{name}'s policy document differs from {path}:\n" + "\n".join(diff))
    sids = ", ".join(s["Sid"] for s in document["Statement"])
    print(f"ok: {name} has exactly the statements of {path} ({sids})")

role_policies = resources["ReconcilerRole"]["Properties"].get("ManagedPolicyArns", [])
if not any(isinstance(p, Tagged) and p.tag == "!Ref" and p.value == "ReconcilerPolicy" for p in role_policies):
    fail("ReconcilerRole does not attach ReconcilerPolicy")
function_role = resources["ReconcilerFunction"]["Properties"]["Role"]
if not (isinstance(function_role, Tagged) and function_role.tag == "!GetAtt"
        and function_role.value in ("ReconcilerRole.Arn", ["ReconcilerRole", "Arn"])):
    fail("ReconcilerFunction does not run under ReconcilerRole")
print("ok: the reconciler function runs under a role with ReconcilerPolicy")

# The table `sluice table create` makes (sluice/src/store/dynamo/table.rs), its attribute
# names taken from the Rust constants.
row_path = "sluice/src/store/dynamo/row.rs"
with open(row_path) as f:
    row = f.read()


def constant(name):
    found = re.findall(rf'\bconst {name}: &str = "([^"]*)";', row)
    if len(found) != 1:
        sys.exit(f"error: {row_path}: expected one `const {name}: &str`, found {len(found)}")
    return found[0]


key, ttl = constant("KEY"), constant("TTL")
slot_dimension, expires_at = constant("SLOT_DIMENSION"), constant("EXPIRES_AT")
expected_table = {
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [
        {"AttributeName": key, "AttributeType": "S"},
        {"AttributeName": slot_dimension, "AttributeType": "S"},
        {"AttributeName": expires_at, "AttributeType": "N"},
    ],
    "KeySchema": [{"AttributeName": key, "KeyType": "HASH"}],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": constant("SLOTS_INDEX"),
            "KeySchema": [
                {"AttributeName": slot_dimension, "KeyType": "HASH"},
                {"AttributeName": expires_at, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        }
    ],
    "TimeToLiveSpecification": {"AttributeName": ttl, "Enabled": True},
}
table = resources.get("Table") or fail("no resource Table")
if table.get("Type") != "AWS::DynamoDB::Table":
    fail("Table is not an AWS::DynamoDB::Table")
for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
    if table.get(policy) != "Retain":
        fail(f"Table's {policy} is not Retain")
properties = table["Properties"]
for prop, value in expected_table.items():
    if properties.get(prop) != value:
        fail(f"Table's {prop} is {properties.get(prop)!r}, `sluice table create` makes {value!r}")
# Options `sluice table create` has too (--warm-writes/--warm-reads) or leaves to the
# operator.
extra = set(properties) - set(expected_table) - {
    "TableName", "PointInTimeRecoverySpecification", "WarmThroughput"}
if extra:
    fail(f"Table has properties `sluice table create` does not set: {sorted(extra)}")
print(f"ok: Table is the table `sluice table create` makes (key {key}, index {constant('SLOTS_INDEX')}, TTL on {ttl})")

environment = resources["ReconcilerFunction"]["Properties"]["Environment"]["Variables"]
table_name = environment.get("SLUICE_TABLE_NAME")
if not (isinstance(table_name, Tagged) and table_name.tag == "!Ref" and table_name.value == "Table"):
    fail("ReconcilerFunction's SLUICE_TABLE_NAME is not the table")
print("ok: the reconciler function's SLUICE_TABLE_NAME is the table")
PY
