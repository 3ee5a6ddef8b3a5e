#!/usr/bin/env python3
"""Take a lock kept in a DynamoDB item with a fencing token, write once through fencegate, release.

    python3 dynamodb_lock.py GATEWAY_URL [--table NAME] [--lock KEY] [--ttl MILLIS]
                             [--endpoint-url URL] [--region REGION]

Needs boto3 (`pip install boto3`) and AWS credentials as boto3 finds them. The table has the
string partition key `lock_key` (made here when it is missing). Amazon's DynamoDB lock client
gives an item a random record version, which is no ordered number; here the conditional write
that takes a free (or expired) lock also adds one to the item's `fence`, and that new value is
the token. Expiry is judged by the clients' clocks, as with a lease table. Never delete the item:
a new one counts from 1 again. Prints `token=N`, then `status=N` (the gateway's answer to the
PUT); exits 0 when the write was accepted (2xx).
"""

import argparse
import sys
import time
import urllib.error
import urllib.request
import uuid

import boto3
from botocore.exceptions import ClientError


def table_of(args):
    dynamodb = boto3.resource("dynamodb", endpoint_url=args.endpoint_url, region_name=args.region)
    table = dynamodb.Table(args.table)
    try:
        table.load()
    except ClientError as missing:
        if missing.response["Error"]["Code"] != "ResourceNotFoundException":
            raise
        table = dynamodb.create_table(
            TableName=args.table,
            KeySchema=[{"AttributeName": "lock_key", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "lock_key", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        table.wait_until_exists()
    return table


def lock(table, key, owner, ttl_ms):
    """Blocks until `owner` holds `key`; returns the fencing token of this grant."""
    while True:
        now = int(time.time() * 1000)
        try:
            item = table.update_item(
                Key={"lock_key": key},
                UpdateExpression="SET #owner = :me, expires_at = :until ADD fence :one",
                ConditionExpression="attribute_not_exists(expires_at) OR expires_at < :now",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues={
                    ":me": owner, ":until": now + ttl_ms, ":now": now, ":one": 1},
                ReturnValues="UPDATED_NEW",
            )["Attributes"]
            return int(item["fence"])
        except ClientError as held:
            if held.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            time.sleep(0.05)


def release(table, key, owner):
    """Ends our lease (the item and its counter stay), only while it is still ours."""
    try:
        table.update_item(
            Key={"lock_key": key},
            UpdateExpression="SET expires_at = :zero",
            ConditionExpression="#owner = :me",
            ExpressionAttributeNames={"#owner": "owner"},
            ExpressionAttributeValues={":zero": 0, ":me": owner},
        )
    except ClientError as taken:
        if taken.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise


def fenced_put(url, token, body):
    request = urllib.request.Request(
        url, data=body.encode(), method="PUT", headers={"X-Fence": str(token)})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:  # 409 stale-fence and other problem answers
        return refused.code, refused.read().decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gateway_url", help="e.g. http://127.0.0.1:8080/invoices/42")
    parser.add_argument("--table", default="locks")
    parser.add_argument("--lock", default="locks/invoice/42")
    parser.add_argument("--ttl", type=int, default=10_000, help="the lease in milliseconds")
    parser.add_argument("--endpoint-url", default=None, help="another DynamoDB endpoint")
    parser.add_argument("--region", default=None)
    args = parser.parse_args()

    table = table_of(args)
    owner = str(uuid.uuid4())
    token = lock(table, args.lock, owner, args.ttl)
    try:
        print(f"token={token}", flush=True)
        status, answer = fenced_put(args.gateway_url, token, f"written under token {token}")
        print(f"status={status}", flush=True)
        if status >= 300:
            print(answer, file=sys.stderr)
    finally:
        release(table, args.lock, owner)
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
