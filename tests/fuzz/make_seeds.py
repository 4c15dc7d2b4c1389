#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into corpus/<target>/ (run once; the
files are committed). Protobuf messages are encoded by hand (field number,
wire type) so that no protobuf package is needed."""
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    n &= (1 << 64) - 1
    out = b''
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(number, value):
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    if isinstance(value, str):
        return field(number, value.encode())
    if isinstance(value, float):
        return varint(number << 3 | 5) + struct.pack('<f', value)
    return varint(number << 3) + varint(value)


def msg(*fields):
    return b''.join(field(n, v) for n, v in fields)


def write(target, name, data):
    d = os.path.join(HERE, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def command(cmd, payload):
    return bytes([cmd]) + struct.pack('<H', len(payload)) + payload


# --- job_spec_text_fuzz: YAML and JSON specs
with open(os.path.join(HERE, '..', '..', 'examples', 'fashion-mnist-mlp.yaml'), 'rb') as f:
    write('job_spec_text_fuzz', 'example.yaml', f.read())
write('job_spec_text_fuzz', 'synthetic.yaml', b'''name: seed
model: {kind: MLP, hiddenSizes: [16, 8], activation: TANH}
data: {dataset: SYNTHETIC, syntheticExamples: 512, syntheticFeatures: 8, syntheticClasses: 3, batchSize: 32, epochs: 2}
optimizer: {kind: ADAM, lr: 0.01, beta1: 0.9}
lrSchedule: {kind: WARMUP_COSINE, warmupSteps: 10}
mode: SSP
staleness: 2
numWorkers: 2
checkpoint: {everySteps: 100, keepLast: 2}
wireFormat: WIRE_BF16
''')
write('job_spec_text_fuzz', 'spec.json',
      b'{"name": "j", "model": {"kind": "SOFTMAX_REGRESSION"}, "data": {"dataset": "FASHION_MNIST", '
      b'"path": "/usr/share/datasets/fashion-mnist", "batchSize": 64}, "optimizer": {"lr": 0.1, "momentum": 0.9}}')
write('job_spec_text_fuzz', 'anchors.yaml', b'base: &b {kind: MLP, hiddenSizes: [4]}\nmodel: *b\n')

# --- idx_fuzz: byte 0 * 4 = length of the image file, then images, labels
images = struct.pack('>IIII', 0x803, 3, 2, 2) + bytes([0, 255, 51, 12, 1, 2, 3, 4, 5, 6, 7, 8])
labels = struct.pack('>II', 0x801, 3) + bytes([7, 0, 9])
assert len(images) % 4 == 0
write('idx_fuzz', 'raw', bytes([len(images) // 4]) + images + labels)
gz_images = zlib.compress(images)  # zlib, not gzip: exercises the raw fallback
write('idx_fuzz', 'swapped', bytes([len(labels) // 4]) + labels[:len(labels) // 4 * 4] + images)

# --- tensor_codec_fuzz: byte 0 = format (low 3 bits) | off-by-one (bit 3)
write('tensor_codec_fuzz', 'fp32', bytes([1]) + struct.pack('<4f', 1.0, -2.5, float('inf'), 0.0))
write('tensor_codec_fuzz', 'bf16', bytes([2]) + struct.pack('<4H', 0x3f80, 0xc020, 0x7f80, 0x7fc1))
write('tensor_codec_fuzz', 'fp16', bytes([3]) + struct.pack('<4H', 0x3c00, 0xc100, 0x7c00, 0x7e01))
write('tensor_codec_fuzz', 'short', bytes([1 | 8]) + b'\x00\x00\x80')


# --- checkpoint_record_fuzz: byte 0 odd = whole record, even = payload
def floats(values):
    return struct.pack('<Q', len(values)) + struct.pack('<%df' % len(values), *values)


payload = (struct.pack('<qqQ', 3, 96, 0x1234567890abcdef) + floats([0.5, -1.0, 2.0, 0.25]) +
           struct.pack('<Q', 1) + floats([0.1, 0.2, 0.3, 0.4]) +
           struct.pack('<Q', 2) + floats([]) + floats([1.0, 1.0, 1.0, 1.0]) +
           struct.pack('<Q', 1) + struct.pack('<Q', 9) + b'worker-0/' + struct.pack('<q', 7) +
           struct.pack('<Q', 2) + struct.pack('<qq', 3, 3))
record = struct.pack('<IIIQ', 0x504B4346, 1, zlib.crc32(payload) & 0xffffffff, len(payload)) + payload
write('checkpoint_record_fuzz', 'payload', b'\x00' + payload)
write('checkpoint_record_fuzz', 'record', b'\x01' + record)
# A table bucket (common/table_state.h): rows of 8 floats (dim 4, Adagrad),
# two rows, one frequency-filter count.
table_state = (struct.pack('<Iqqq', 8, 5, 2, 0) + struct.pack('<Q', 2) +
               struct.pack('<Qq8f', 11, 4, 0.1, -0.2, 0.3, 0.0, 0.5, 0.5, 0.5, 0.5) +
               struct.pack('<Qq8f', 1 << 63, 3, 1.0, 2.0, 3.0, 4.0, 0.1, 0.1, 0.1, 0.1) +
               struct.pack('<Q', 1) + struct.pack('<Qiq', 99, 1, 4))
bucket = (struct.pack('<qqQ', 4, 0, 0) + floats([]) + struct.pack('<Q', 0) + struct.pack('<Q', 0) +
          struct.pack('<Q', 0) + struct.pack('<Q', 2) + struct.pack('<qq', 4, 3) +
          struct.pack('<Q', len(table_state)) + table_state)
write('checkpoint_record_fuzz', 'bucket', b'\x00' + bucket)
# The same bucket stored incrementally on checkpoint 1 (the harness composes
# it on the state above): key 11 as there, key 2^63 changed, key 5 new.
delta_state = (struct.pack('<Iq', 0xFFFFFFFF, 1) + struct.pack('<Iqqq', 8, 7, 3, 0) + struct.pack('<Q', 3) +
               struct.pack('<QB', 11, 0) +
               struct.pack('<QBq8f', 1 << 63, 1, 6, 1.5, 2.0, 3.0, 4.0, 0.2, 0.1, 0.1, 0.1) +
               struct.pack('<QBq8f', 5, 1, 6, 0.0, 0.0, 1.0, 1.0, 0.3, 0.3, 0.3, 0.3) +
               struct.pack('<Q', 1) + struct.pack('<Qiq', 99, 2, 6))
delta_bucket = (struct.pack('<qqQ', 6, 0, 0) + floats([]) + struct.pack('<Q', 0) + struct.pack('<Q', 0) +
                struct.pack('<Q', 0) + struct.pack('<Q', 2) + struct.pack('<qq', 6, 5) +
                struct.pack('<Q', len(delta_state)) + delta_state)
write('checkpoint_record_fuzz', 'bucket-incremental', b'\x00' + delta_bucket)

# --- parameter_service_fuzz: commands (0 SetupJob, 2 Push, 3 Replicate,
# 4 Pull, 5 Reconfigure, 6 CopyChunk, 7 Checkpoint, 1 DropJob ...)
def chunk_location(i, shard=0):
    return msg((1, i), (2, 0), (3, i * 4), (4, 4), (5, shard))


shard_map = msg((1, 1), (2, 4), (3, msg((1, 'w'), (2, 8), (3, 8))), (4, chunk_location(0)), (4, chunk_location(1)),
                (5, msg((1, 0), (2, 'ps-0'))))
spec_bsp = msg((4, msg((1, 1), (2, 0.5))), (6, 1))  # optimizer {SGD, lr 0.5}, mode BSP
setup = msg((1, 'job-a'), (2, spec_bsp), (3, 1), (4, 100),
            (5, msg((1, 0), (2, 0), (3, 0), (4, 4), (5, 2), (6, 0.1))),
            (5, msg((1, 1), (2, 0), (3, 4), (4, 4), (5, 1))), (6, shard_map), (7, 'ps-0'))
grad = struct.pack('<4f', 1, 2, 3, 4)
push = msg((1, 'job-a'), (2, 'w0'), (3, 0), (4, 1), (5, 0), (6, msg((1, 0), (2, grad))), (6, msg((1, 1), (2, grad))),
           (7, 1))
pull = msg((1, 'job-a'), (2, b'\x00\x01'), (3, 1), (4, 1))
checkpoint = msg((1, 'job-a'), (2, 1), (3, 0), (4, 5))
write('parameter_service_fuzz', 'setup_push_pull',
      command(0, setup) + command(2, push) + command(4, pull) + command(7, checkpoint) +
      command(8, msg((1, 'job-a'), (2, 1), (3, 0))) + command(6, msg((1, 'job-a'), (2, 1))) +
      command(5, msg((1, 'job-a'), (2, shard_map))) + command(1, msg((1, 'job-a'), (2, 'done'), (3, 1))))
spec_asp = msg((4, msg((1, 2), (2, 0.01))), (6, 2))  # ADAM, ASP
setup_asp = msg((1, 'job-b'), (2, spec_asp), (3, 2), (4, 10), (5, msg((1, 0), (2, 0), (3, 0), (4, 4))),
                (6, shard_map), (7, 'ps-0'))
write('parameter_service_fuzz', 'asp',
      command(0, setup_asp) + command(3, push.replace(b'job-a', b'job-b')) + command(4, pull.replace(b'job-a', b'job-b')))
# Sparse tables: a job with table "linear" (dim 1, 4 buckets on shard 0),
# then 240 SparsePull, 241 SparsePush and 243 SparseReplicate.
table_map = shard_map + msg((6, msg((1, 'linear'), (2, 1), (3, 4), (4, 0), (4, 0), (4, 0), (4, 0))))
spec_tables = msg((2, msg((1, 3), (6, msg((1, 'linear'), (2, msg((1, 1), (2, 0.5))))))),
                  (4, msg((1, 1), (2, 0.5))), (6, 2))
setup_tables = msg((1, 'job-c'), (2, spec_tables), (3, 1), (4, 10), (5, msg((1, 0), (2, 0), (3, 0), (4, 4))),
                   (6, table_map), (7, 'ps-0'))
keys = struct.pack('<3Q', 1, 2, 1 << 40)
sparse_pull = msg((1, 'job-c'), (2, 1), (3, msg((1, 0), (2, keys))))
sparse_push = msg((1, 'job-c'), (2, 'w0'), (3, 0), (4, 1), (5, 1),
                  (6, msg((1, 0), (2, keys), (3, struct.pack('<3f', 0.5, -1, 2)))))
write('parameter_service_fuzz', 'sparse',
      command(0, setup_tables) + command(241, sparse_push) + command(240, sparse_pull) + command(241, sparse_push) +
      command(243, sparse_push))

# --- cluster_service_fuzz: 0 Register, 1 Heartbeat, 2 ReportWork, 3 Leave,
# 4 ListMembers, 5 SubmitJob, 6 CancelJob, 7 GetJob, 8 advance clock, 9 tick
register_server = msg((1, 1), (2, '127.0.0.1:7001'), (4, 'server-0'), (8, 11))
register_worker = lambda n: msg((1, 2), (4, 'worker-%d' % n), (8, 20 + n))
spec = msg((2, msg((1, 2), (2, b'\x10'))), (3, msg((1, 2), (3, 32), (4, 1), (6, 512), (7, 8), (8, 3))),
           (4, msg((1, 1), (2, 0.1))), (7, 2))
ready = lambda n: msg((1, 'worker-%d' % n), (2, 'job-0001'), (3, 1), (4, 512), (5, 102), (6, 8), (7, 3))
done = lambda n: msg((1, 'worker-%d' % n), (2, 'job-0001'), (3, 4), (15, b'\x00\x01'))
write('cluster_service_fuzz', 'job_life',
      command(0, register_server) + command(0, register_worker(0)) + command(0, register_worker(1)) +
      command(5, msg((1, spec))) + command(9, b'') + command(2, ready(0)) + command(2, ready(1)) + command(9, b'') +
      command(1, msg((1, 'worker-0'), (2, 'job-0001'))) + command(2, done(0)) + command(2, done(1)) +
      command(8, b'\x50') + command(9, b'') + command(7, msg((1, 'job-0001'))) + command(4, b''))
write('cluster_service_fuzz', 'expiry',
      command(0, register_server) + command(0, register_worker(0)) + command(5, msg((1, spec))) +
      command(8, b'\xff') + command(9, b'') + command(3, msg((1, 'server-0'))) + command(6, msg((1, 'job-0001'))))
print('seeds written under', os.path.join(HERE, 'corpus'))

# --- payload_wire_fuzz: byte 0 = message (bits 0-1: 0 PushRequest,
# 1 PullResponse, 2 SparsePushRequest, 3 SparsePullResponse) and slice size
# (bits 2-7); the rest is the message.
chunk_a = msg((1, 3), (2, floats([0.5, -1.0, 2.0, 0.25])), (5, 1))
chunk_b = msg((2, b'\x01\x02'), (1, 9), (3, 7), (4, 2))
write('payload_wire_fuzz', 'push', bytes([0]) + msg((1, 'job'), (2, 'worker-1'), (4, 5), (5, 2), (6, chunk_a),
                                                    (7, 3), (6, chunk_b), (9, 12345)))
write('payload_wire_fuzz', 'pull', bytes([1 | 12]) + msg((1, chunk_b), (1, chunk_a)))
# SparseKeys: 1 table, 2 keys, 3 rows (rows of 3 floats; the second table
# names its rows before its keys, and twice: the last one counts).
table_a = msg((1, 0), (2, b'\x07' * 16), (3, struct.pack('<6f', 0.5, -1.0, 2.0, 0.25, 3.0, -2.0)))
table_b = msg((3, struct.pack('<f', 9.0)), (1, 2), (2, b'\x01' * 8), (3, struct.pack('<3f', 1.0, 2.0, 3.0)))
write('payload_wire_fuzz', 'sparse_push', bytes([2 | 8]) + msg((1, 'job'), (2, 'worker-1'), (4, 7), (6, table_a),
                                                             (9, 1), (6, table_b), (7, 0), (8, 1)))
write('payload_wire_fuzz', 'sparse_pull', bytes([3 | 4]) + msg((1, table_b), (1, table_a)))
