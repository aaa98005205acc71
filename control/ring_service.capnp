@0xbea0fdd5429e716e;
# The control channel between a producer and the ring owner: Cap'n Proto RPC, two-party over
# TCP. protocol-spec/sessions.md gives the meaning of every field and the session state machine;
# the data path never touches these messages. By default the stream is mutual TLS
# (sessions.md §2.1); plain TCP only when the application asks for it by name.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("rdmaring::control::schema");

enum PublishMode {
  unspecified @0;
  imm @1;   # RDMA_WRITE_WITH_IMM publishes
  tail @2;  # an inline tail-record write publishes (strictly ordered ring MR)
}

# Who is asking: the session, the epoch the caller is in, and proof that it holds the session
# secret (16 bytes, keyed BLAKE2b over purpose, session, epoch, this connection's nonce and
# counter: sessions.md §3). counter: per connection, from 1, larger than every counter the
# owner accepted on this connection before.
struct Credentials {
  session @0 :UInt64;
  epoch @1 :UInt64;
  proof @2 :Data;
  counter @3 :UInt64;
}

# What hello answers: the nonce every proof on this connection covers, and who the owner
# authenticated at the other end of the channel.
struct Channel {
  nonce @0 :Data;       # 16 bytes, fresh for this connection
  identity @1 :Text;    # the producer's certificate's subject common name; "" on plain TCP
}

struct ChannelOrRefusal {
  union {
    channel @0 :Channel;
    refused @1 :Refusal;
  }
}

# A ring and the point to continue from, valid for one epoch. The producer connects its RC QP
# to dataPort with wire::ConnectData naming {session, epoch, proof}.
struct RingGrant {
  session @0 :UInt64;
  secret @1 :Data;            # 32 bytes; sent by attach only
  epoch @2 :UInt64;           # from 1
  mode @3 :PublishMode;
  relaxedOrdering @4 :Bool;   # the ring MR is registered with IBV_ACCESS_RELAXED_ORDERING (imm only)
  ringAddr @5 :UInt64;
  ringRkey @6 :UInt32;        # a new key every epoch: the last epoch's key is revoked
  ringBytes @7 :UInt64;
  maxRecord @8 :UInt32;
  tailAddr @9 :UInt64;        # mode tail only
  tailRkey @10 :UInt32;
  position @11 :UInt64;       # the owner's read head: the next record starts here
  released @12 :UInt64;       # the producer may write below released + ringBytes
  nextSequence @13 :UInt64;   # the sequence of the record at position
  dataPort @14 :UInt16;
  leaseMillis @15 :UInt32;    # 0: no lease
  payloadCheck @16 :PayloadCheck;  # whether a data record's check covers its payload
  recvBudget @17 :UInt32;     # mode imm: this session's share of the owner's shared receives
}

enum PayloadCheck {
  crc32c @0;  # the record's check covers header and payload, checked by the owner (the default)
  none @1;    # the check covers the header alone: the publish event and RC's ICRC are trusted
}

struct Refusal {
  code @0 :Code;
  message @1 :Text;
  enum Code {
    badRequest @0;       # malformed or out-of-range fields
    versionMismatch @1;
    unknownSession @2;   # never attached, detached, lease expired, or forgotten by an owner restart
    badProof @3;
    staleEpoch @4;       # an epoch the session has left: a replayed or late message
    noCapacity @5;       # the owner's session limit, or no memory for the ring
    ringChanged @6;      # an owner restart changed the ring's geometry or mode
    memlockTooLow @7;    # the owner's RLIMIT_MEMLOCK does not cover the ring's registration
    odpUnsupported @8;   # the owner registers with on-demand paging its device does not have
    unauthenticated @9;  # the channel established no identity or no nonce (hello first)
    unauthorized @10;    # the identity matches no allow rule, or the session is another identity's
    quotaExceeded @11;   # the identity's allow rule admits no more sessions or ring bytes
  }
}

struct GrantOrRefusal {
  union {
    grant @0 :RingGrant;
    refused @1 :Refusal;
  }
}

interface RingService {
  # A new session and its ring, epoch 1.
  # Where credit goes back is per connection: wire::ConnectData carries the producer's credit MR.
  attach @0 (version :UInt32) -> (reply :GrantOrRefusal);

  # The caller's connection died (or its process restarted): fence the epoch, revoke the ring's
  # key and grant the next epoch. `restarted`: the caller lost its staging and continues from
  # the grant; otherwise `released`/`releasedSequence` say from where it still holds its
  # records (its resend point: the first position it holds, that record's sequence), which an
  # owner restored after its own restart resumes from.
  resume @1 (who :Credentials, restarted :Bool,
             released :UInt64, releasedSequence :UInt64) -> (reply :GrantOrRefusal);

  # Keeps the lease of an idle session.
  heartbeat @2 (who :Credentials) -> (refused :Refusal, ok :Bool);

  # Ends the session: its ring and registration are freed.
  detach @3 (who :Credentials) -> (refused :Refusal, ok :Bool);

  # The connection's nonce, once per connection, before any resume, heartbeat or detach on it.
  hello @4 (version :UInt32) -> (reply :ChannelOrRefusal);
}
