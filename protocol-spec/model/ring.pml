/*
 * rdmaring publish protocol: one producer, one consumer and the fabric between them, with
 * connection drops and resumes. README.md next to this file says what is modelled, what is
 * abstracted away, the properties and the runs; `check` runs them all.
 *
 * Configuration (each a macro: spin -DNAME=VALUE -a ring.pml):
 *   MODE          1 = imm: the batch's last WRITE is a WRITE_WITH_IMM, its receive completion
 *                 publishes; 2 = tail: a tail-record WRITE after the payload publishes
 *   RELAXED       1 = the ring MR has relaxed ordering: the fabric may place payload WRITEs late,
 *                 in any order, after later WRITEs of the QP (the tail MR never has it)
 *   CHECK         1 = the consumer checks the record at head (exact expected sequence, standing
 *                 for kind, length, check and sequence: wire-formats.md §2.4);
 *                 0 = it trusts the publish mark, as naive implementations do
 *   NOTREADY_OK   0 = assert that a record below the mark never fails its check (what mode imm's
 *                 completion, or mode tail's in-order placement, promises); 1 = it may fail, and
 *                 must then be waited out or reported, never delivered
 *   RESTART       1 = a reconnect may also restart the producer empty (its staging lost) at the
 *                 consumer's resume point, as the loopback test's restart_producer() does (the
 *                 cores allow it; the adapters do not offer it, ledger.md §6.2); 0 = the producer
 *                 always resumes with its staging (resume.md)
 *   TAIL_EPOCH    1 = the consumer ignores tail records of another epoch (wire-formats.md §4)
 *   CREDIT_EPOCH  1 = the producer ignores credit records of another epoch (wire-formats.md §5)
 *   ZERO_ON_RESUME 1 = begin_epoch zeroes the ring outside [released, head), the part the producer
 *                 will write again (a proposed rule; the cores leave the bytes as they are)
 *   SEEN_RESET    1 = begin_epoch also resets credit_requests_seen to 0 (a proposed fix; the
 *                 cores keep it, while a restarted producer counts its requests from 0 again)
 *   CTHRESH       lazy credit threshold in slots (2 = ring / credit_fraction 2); N + 1 = credit
 *                 is written only when the producer asks
 *   MAXREC        positions (records) the producer may commit, over all connections
 *   MAXDROP       connection drops, each followed by a resume in epoch + 1
 *   NO_P4, NO_P8  leave out the P4 (P8) assertions, to see what else would break
 *   PROBE_WINDOW  (SESSION) a probe: assert that no late request admitted in the retry window
 *                 fences the producer's live QP (it must fail: the window is reached)
 *   SESSION       1 = connections go through the ring owner's session table (sessions.md): the
 *                 producer's resume request, the owner's fence and grant (table.resume, fence,
 *                 begin_epoch), the grant's reply (which may be lost), the producer's resume(),
 *                 its connect request (table.admit_connect: the current epoch only), the owner's
 *                 ESTABLISHED (on_connected, which ends the retry window); old control messages
 *                 at any step. Protocol v4's replay check: every control connection has its own
 *                 nonce (the owner's hello), every resume carries it and a counter, and the owner
 *                 refuses one whose nonce is not its connection's or whose counter does not
 *                 exceed the last it accepted there (badProof). 0 = one atomic resume step, as in
 *                 runs 1-17
 *   MAXREPLAY     (SESSION) old control messages, per run: a resume request of the producer's own
 *                 arriving late over the connection it was sent on (LATE), a resume captured in
 *                 any epoch (the current one included) replayed by a third party, over its own
 *                 connection or injected into the producer's, or a connect request captured in an
 *                 older epoch, offered to the owner at any step
 *   LATE          (SESSION) 1 = one of the old messages may be a late resume request of the
 *                 producer's own (its call timed out, the client dropped that connection): its
 *                 nonce and counter are right for the connection it arrives on; 0 = only third
 *                 parties' replays and old connect requests
 *   MAXLOST       (SESSION) resume replies lost on the way to the producer (the call times out:
 *                 the producer's next call goes over a new connection, with a fresh nonce)
 *   FALLBACK      (SESSION) 1 = a producer whose resume is refused as stale asks again from each
 *                 earlier epoch it can sign for, newest first; 0 = only from its core's epoch, as
 *                 Producer::recover does, and it gives up when refused
 *   ADMIT_STALE   (SESSION, mutant) the table admits a resume or a connect of any older epoch
 *   KEEP_UNCONF   (SESSION, mutant) the table keeps the unconfirmed epoch U after the new epoch's
 *                 QP is established, so a resume of U stays admissible
 *   RETRY_RANGE   (SESSION, a proposed rule) while resuming, the table admits a resume of any epoch
 *                 from U to the current one, not only U and the current one: the epochs granted
 *                 by earlier retries, which the producer may hold
 *   NO_NONCE      (SESSION, mutant) the owner does not compare a message's nonce with its
 *                 connection's (protocol v3's proofs, which bind no nonce, with v4's counter)
 *   NO_COUNTER    (SESSION, mutant) the owner does not compare a message's counter with the last
 *                 one it accepted on the connection
 *   SLEEP         1 = the ring owner may sleep (the wake-up protocol of wakeup.md, protocol v3;
 *                 README.md §1.2). When it sees nothing pending (nothing unread, tail MR
 *                 unchanged, CQ empty, no credit owed, every record it read released): mode tail:
 *                 a credit record with the doorbell flag set (unless the last one carried it; only
 *                 over a live, established link), then, once that write has completed, the re-check
 *                 of the tail MR: moved, it stays awake, else it is asleep; mode imm: CQ armed and
 *                 re-drained, asleep. Asleep it takes no step until a receive completion is in
 *                 the CQ (mode tail: the producer's doorbell, a zero-length WRITE_WITH_IMM after
 *                 the tail write), which wakes it; a doorbell while its flag is set makes it write
 *                 a credit record with flag 0. A new epoch wakes it. The producer (mode tail) keeps
 *                 a doorbell state per epoch (starts set; a credit record of its epoch sets it to
 *                 the flag), follows every publish with a doorbell while it is set (read after the
 *                 publish is posted), and owes a doorbell (the repair rule) when it takes a record
 *                 with the flag set and released below its published position.
 *                 0 = none of it: runs 1-24 are unchanged, states included
 *   MAXSLEEP      (SLEEP) sleeps the owner may begin over a run (default 2); then it stays awake
 *   FLAG_FIRST    (SLEEP, mutant) the producer reads its doorbell state before it posts the publish
 *   NO_REPAIR     (SLEEP, mutant) the producer has no repair rule
 *   SLEEP_UNCONFIRMED (SLEEP, mutant) the owner re-checks the tail MR without waiting for its flag
 *                 write to complete (the model shows it is still safe: README.md §5 item 9)
 *   CLEAR_ASK     (SLEEP, mutant) a credit record that returns no credit (released unchanged, only
 *                 the flag changes) clears the credit request seen, as ConsumerCore::take_credit
 *                 did (README.md §5 item 8); 0 = the request stays pending until released
 *                 moves (wakeup.md O2)
 *   INIT_CLEAR    (SLEEP, mutant) the producer starts each epoch with its doorbell state clear
 *   NO_FLAG       (SLEEP, mutant) the owner sleeps without writing the flag (skips step 2)
 *   NO_REDRAIN    (SLEEP, mode imm, mutant) the owner arms the CQ after its drain and sleeps
 *                 without draining again: a completion queued before the arming raises no event
 *   PSLEEP        (SLEEP; default SLEEP) the producer sleeps too (wakeup.md §2.1, README.md §1.2):
 *                 waiting for credit (ring full, or draining) with its request posted and nothing
 *                 else to post, it polls its CQ and reads its credit MR, arms the CQ, polls and
 *                 reads again (one step: see NO_REPOLL): nothing new, it is asleep, and takes no
 *                 step until a receive completion is in its CQ: the owner's notifying credit
 *                 records (written with an immediate: the answer to a request, the flag set) make
 *                 one when they land; a drop makes them too (the QP's receives complete in
 *                 error). Awake, it reads its credit MR at any step. 0 = it never sleeps (the
 *                 model of runs 25-36 before the producer slept, state for state)
 *   DRAIN         (PSLEEP) having committed its last record the producer drains, as
 *                 Producer::drain(): it asks for credit until released = committed, and sleeps
 *                 meanwhile; P6 then also asks for released = committed at the end. 0 = it sleeps
 *                 only with its ring full (send(payload, timeout))
 *   REPEAT_ANSWER (PSLEEP; default 1: wakeup.md O6 since 2026-12-03, README.md §5 item 12) the owner that sees a
 *                 credit request while the last record that moved released was a plain WRITE
 *                 (lazy credit, or a clear of the flag: the producer may not have taken it before
 *                 it asked and slept) writes at once a notifying record, released as it is; the
 *                 request stays pending until released moves. 0 = the code and wakeup.md O6 as
 *                 they stood: only a record that moves released after the request was seen, or
 *                 sets the flag, is notifying
 *   ANSWER_PLAIN  (PSLEEP, mutant) the owner answers a credit request with a plain WRITE
 *   FLAG_PLAIN    (PSLEEP, mode tail, mutant) the owner sets the flag with a plain WRITE (§6 H)
 *   NO_REPOLL     (PSLEEP, mutant) the producer polls (a step), then arms its CQ and sleeps
 *                 without polling again (a later step): a completion that came between its poll
 *                 and the arming raises no event (wakeup.md §6 I)
 *   SLEEP_NO_ASK  (PSLEEP, mutant) the producer may sleep waiting for credit without having asked
 *
 * Properties (assertions; README.md §3):
 *   P1 the consumer delivers only the record it expects, fully placed, as the current producer
 *      sent it;  P2 in order, never twice;  P3 a WRITE lands only on a slot the consumer
 *      released;  P4 a record or completion of an old epoch never moves the publish mark or the
 *      producer's released;  P5 (when NOTREADY_OK = 0) a record below the mark always passes its
 *      check;  P6 when nothing can move any more, everything committed was delivered (unless a
 *      side failed);  P7 the producer accepts the consumer's resume point;  P8 nothing lands on
 *      a record the consumer may still read, or is reading, other than that same record;
 *   P9 (SESSION) a control message of an epoch the session left (older than the current one and
 *      not the unconfirmed one) changes nothing: not the ring, the consumer's positions, the
 *      epoch, the session's state or the producer's link.
 *   P10 (SESSION) a resume replayed by a third party, captured in any epoch (the current one
 *      included), is never admitted: the replayer never receives a grant, never fences an epoch.
 *   With SLEEP, P6 is also the lost-wake-up property: an owner asleep is blocked, so an end state
 *   where it sleeps while something published is undelivered fails P6. With PSLEEP the producer's
 *   too: a producer asleep is blocked, so an end state where it sleeps waiting for credit that
 *   the owner released (and wrote, plainly, or never wrote) fails P6: it committed less than
 *   MAXREC, or (DRAIN) its released is below what it committed.
 */

#ifndef MODE
#define MODE 1
#endif
#ifndef RELAXED
#define RELAXED 0
#endif
#ifndef CHECK
#define CHECK 1
#endif
#ifndef NOTREADY_OK
#define NOTREADY_OK 0
#endif
#ifndef RESTART
#define RESTART 0
#endif
#ifndef TAIL_EPOCH
#define TAIL_EPOCH 1
#endif
#ifndef CREDIT_EPOCH
#define CREDIT_EPOCH 1
#endif
#ifndef ZERO_ON_RESUME
#define ZERO_ON_RESUME 0
#endif
#ifndef SEEN_RESET
#define SEEN_RESET 0
#endif
#ifndef CTHRESH
#define CTHRESH 2
#endif
#ifndef MAXREC
#define MAXREC 5
#endif
#ifndef MAXDROP
#define MAXDROP 1
#endif
#ifndef SESSION
#define SESSION 0
#endif
#ifndef MAXREPLAY
#define MAXREPLAY 1
#endif
#ifndef MAXLOST
#define MAXLOST 1
#endif
#ifndef LATE
#define LATE 1
#endif
#ifndef NO_NONCE
#define NO_NONCE 0
#endif
#ifndef NO_COUNTER
#define NO_COUNTER 0
#endif
#ifndef FALLBACK
#define FALLBACK 1
#endif
#ifndef ADMIT_STALE
#define ADMIT_STALE 0
#endif
#ifndef KEEP_UNCONF
#define KEEP_UNCONF 0
#endif
#ifndef RETRY_RANGE
#define RETRY_RANGE 0
#endif
#ifndef SLEEP
#define SLEEP 0
#endif
#ifndef MAXSLEEP
#define MAXSLEEP 2
#endif
#ifndef FLAG_FIRST
#define FLAG_FIRST 0
#endif
#ifndef NO_REPAIR
#define NO_REPAIR 0
#endif
#ifndef SLEEP_UNCONFIRMED
#define SLEEP_UNCONFIRMED 0
#endif
#ifndef CLEAR_ASK
#define CLEAR_ASK 0
#endif
#ifndef INIT_CLEAR
#define INIT_CLEAR 0
#endif
#ifndef NO_FLAG
#define NO_FLAG 0
#endif
#ifndef NO_REDRAIN
#define NO_REDRAIN 0
#endif
#ifndef PSLEEP
#define PSLEEP SLEEP
#endif
#ifndef DRAIN
#define DRAIN 0
#endif
#ifndef REPEAT_ANSWER
#define REPEAT_ANSWER 1
#endif
#ifndef ANSWER_PLAIN
#define ANSWER_PLAIN 0
#endif
#ifndef FLAG_PLAIN
#define FLAG_PLAIN 0
#endif
#ifndef NO_REPOLL
#define NO_REPOLL 0
#endif
#ifndef SLEEP_NO_ASK
#define SLEEP_NO_ASK 0
#endif
#if PSLEEP && !SLEEP
#error PSLEEP needs SLEEP
#endif
#if DRAIN && !PSLEEP
#error DRAIN needs PSLEEP
#endif

#define IMM  1
#define TAIL 2

#define N     4    /* ring slots, one record each: positions count records, slot = pos % N */
#define QCAP  6    /* WRs posted and not yet executed by the responder (send queue room) */
#define PCAP  4    /* relaxed WRITEs executed but not yet placed */
#define CQCAP 3    /* receive completions not yet polled */
#define CRCAP 2    /* credit WRITEs not yet executed */
#define NONE  255  /* no ring position: zero-length WRITE_WITH_IMM, tail record */

/* Sequences: the record at position p has sequence p + 1 (next_sequence of the first
 * connection is 1, so that 0 can stand for zeroed memory). The resume point carries position
 * and sequence together, so a resumed or restarted producer keeps this numbering. */
#define SEQ(p) ((p) + 1)

/* consumer protocol violations (sticky until the next epoch: begin_epoch clears them). An
 * immediate with foreign epoch bits (failures.md) cannot occur here: see on_immediate. */
#define V_CHECK 1  /* mode imm: a record below the mark fails its check, at once */
#define V_GRACE 2  /* mode tail: a record below the mark still fails after ordering_grace */
#define V_RANGE 4  /* a publish mark outside [credited, credited + ring] */

mtype = { WR, WIMM, WTAIL };

/* ---- connection ---- */
byte epoch = 1;   /* the connection's epoch. Every WRITE carries the epoch it was posted in;
                   * one of an older epoch is refused (ring and tail MR re-keyed at a resume;
                   * credit WRITEs need the producer's old QP, in the error state by then) */
bit  up = 1;
byte drops = 0;

/* ---- consumer memory ---- */
byte ring[N];      /* sequence of the record placed in the slot; 0 = zeroed */
byte ring_inc[N];  /* ghost: incarnation of the producer whose WRITE placed it */
bit  tm_valid;     /* tail MR: 0 = zeroed, fails its check */
byte tm_ep, tm_tail, tm_creq;

/* ---- producer memory ---- */
bit  cm_valid;     /* credit MR: 0 = zeroed, never decoded */
byte cm_ep, cm_rel;

/* ---- fabric ---- */
chan qp = [QCAP] of { mtype, byte, byte, byte, byte, byte };  /* kind, epoch, pos, incarnation, tail, request */
chan cq = [CQCAP] of { byte, byte, bit };                      /* immediate: epoch bits, tail, credit request */
#if PSLEEP
chan cr = [CRCAP] of { byte, byte, bit, bit };                 /* credit record: epoch, released, doorbell flag,
                                                                * notifying (WRITE_WITH_IMM) */
#define CR_SEND(rel, flag, n) cr!epoch, rel, flag, n
#elif SLEEP
chan cr = [CRCAP] of { byte, byte, bit };                      /* credit record: epoch, released, doorbell flag */
#define CR_SEND(rel, flag, n) cr!epoch, rel, flag
#else
chan cr = [CRCAP] of { byte, byte };                           /* credit record: epoch, released */
#endif
bit  pd_valid[PCAP];                                           /* executed, not yet placed (relaxed) */
byte pd_ep[PCAP], pd_pos[PCAP], pd_inc[PCAP];
byte npend = 0;      /* valid pd_ entries */
byte npend_cur = 0;  /* ... of the current epoch (derived from the above) */

/* ---- producer core (positions in records) ---- */
byte p_rel, p_pub, p_com;
byte p_inc = 0;    /* ghost: incarnation, + 1 when the producer restarts empty */
bit  p_want, p_asked, p_dead;
byte p_creq;       /* tail record's credit_requests counter */

/* ---- consumer core ---- */
byte c_cred, c_rel, c_del, c_head, c_mark;
bit  c_asked;
byte c_seen;       /* credit_requests_seen: last counter seen in a tail record */
byte c_viol = 0;
byte g_last = 0;   /* ghost: last sequence delivered, over all epochs */

/* mode tail: the tail MR holds a record of this epoch the consumer has not taken yet */
#define TAIL_NEWS (tm_valid && (!TAIL_EPOCH || tm_ep == epoch) && (tm_tail > c_mark || tm_creq != c_seen))

#if SLEEP
/* ---- the owner's sleep and the doorbell (wakeup.md; README.md §1.2) ---- */
#define AWAKE    0  /* the owner polls */
#define FLAGGING 1  /* mode tail: the flag is set in the last credit record written; the owner waits
                     * for that write to complete (to have landed in the producer's credit MR) */
#define ASLEEP   2  /* blocked: it takes no step until a receive completion is in the CQ */
byte c_slp = AWAKE;
byte sleeps = 0;   /* sleeps begun, over the run (at most MAXSLEEP) */
#if MODE == TAIL
bit  c_flag = 1;   /* the flag of the last credit record written (doorbell_written_); per epoch it
                    * starts set, as the producer's doorbell state does */
bit  p_door = !INIT_CLEAR;  /* producer: its doorbell state (doorbell_), per epoch it starts set */
#else
bit  c_flag = 0;   /* mode imm: always 0 */
bit  p_door = 0;
#endif
bit  c_clr = 0;    /* a doorbell came while the flag was set: a credit record with flag 0 is owed */
bit  cm_flag;      /* producer memory: the credit MR's flag */
bit  p_ring = 0;   /* producer: a doorbell is owed (the repair rule, ring_) */
#if NO_REDRAIN
#define ARMING 3    /* mode imm, mutant: drained, the CQ not armed yet */
byte c_cqn = 0;     /* completions in the CQ when it was armed: they raise no event */
#define CQ_POLL_OK (c_slp == AWAKE || (c_slp == ASLEEP && len(cq) > c_cqn))
#else
#define CQ_POLL_OK 1
#endif
#if FLAG_FIRST
bit  p_rd = 0, p_dbr = 0;  /* mutant: the flag was read (p_dbr) before the publish is posted */
#endif
#define AWAKE_ (c_slp == AWAKE)
#if MODE == TAIL
/* and nothing new in the tail MR; room for the flag write when one is needed */
#define SLEEP_MODE_OK (!TAIL_NEWS && (c_flag || !CREDIT_LINK || len(cr) < CRCAP))
#else
#define SLEEP_MODE_OK 1
#endif
#if FLAG_FIRST
#define FLAG_READ p_rd
#else
#define FLAG_READ 1
#endif
/* begin_epoch (the consumer's side) and ProducerCore::resume (the producer's) */
#if PSLEEP
#define SLEEP_EPOCH c_slp = AWAKE; c_flag = (MODE == TAIL); c_clr = 0; c_plain = 0
#else
#define SLEEP_EPOCH c_slp = AWAKE; c_flag = (MODE == TAIL); c_clr = 0
#endif
#if FLAG_FIRST
#define PRODUCER_SLEEP_EPOCH0 p_door = (MODE == TAIL && !INIT_CLEAR); p_ring = 0; p_rd = 0; p_dbr = 0
#else
#define PRODUCER_SLEEP_EPOCH0 p_door = (MODE == TAIL && !INIT_CLEAR); p_ring = 0
#endif
#if PSLEEP && NO_REPOLL
#define PRODUCER_SLEEP_EPOCH PRODUCER_SLEEP_EPOCH0; p_slp = P_AWAKE; p_rcv = 0; p_ev = 0
#elif PSLEEP
#define PRODUCER_SLEEP_EPOCH PRODUCER_SLEEP_EPOCH0; p_slp = P_AWAKE
#else
#define PRODUCER_SLEEP_EPOCH PRODUCER_SLEEP_EPOCH0
#endif
#if PSLEEP
/* ---- the producer's sleep (wakeup.md §2.1; README.md §1.2) ---- */
#define P_AWAKE  0  /* it runs: reads its credit MR at any step (P5) */
#define P_POLLED 1  /* NO_REPOLL: P6 steps 1-2 done (flushed, CQ polled empty, credit MR read:
                     * nothing new); it is about to arm its CQ and takes no other step */
#define P_ASLEEP 2  /* blocked: it takes no step until an event of its armed CQ */
byte p_slp = P_AWAKE;
bit  c_plain = 0;  /* owner: the last record that moved released was a plain WRITE, and no
                    * notifying record was written after it (REPEAT_ANSWER) */
#if NO_REPOLL
/* The mutant needs the producer's CQ: its poll and its arming are two steps, and a completion
 * queued between them raises no event. (With the re-poll they can be one step: whatever lands
 * between the poll and the arming, the re-poll finds; then the CQ is empty whenever the producer
 * is asleep, a completion is an event, and one that comes while it is awake needs no bit: its
 * next sleep polls it away, and the record it announces is in the credit MR.) */
bit  p_rcv = 0;    /* a receive completion is in the producer's CQ, not yet polled */
bit  p_ev = 0;     /* an event of the armed CQ (a completion queued after the arming) */
#endif
#define P_AWAKE_ (p_slp == P_AWAKE)
/* The QP goes to the error state (a drop, a fence): its posted receives complete in error (P7:
 * some are always posted), which is an event of the armed CQ: a sleeping producer wakes */
#define P_WAKE_ ; p_slp = P_AWAKE  /* appended to a statement (empty without PSLEEP) */
/* The producer waits for credit: its ring is full, or it drains (DRAIN: everything committed,
 * not all released); it asked (SLEEP_NO_ASK: not necessarily), and everything is posted (P6
 * step 1: nothing committed unpublished, no request or doorbell waiting) */
#define P_WANTS_CREDIT ((p_com < MAXREC && p_com == p_rel + N) || (DRAIN && p_com == MAXREC && p_rel < p_com))
#define P_MAY_SLEEP (up && !p_dead && P_AWAKE_ && (p_asked || SLEEP_NO_ASK) && !p_want && !p_ring && \
                     p_com == p_pub && P_WANTS_CREDIT)
#define C_REPEAT (REPEAT_ANSWER && c_asked && c_plain)
#else
#define P_AWAKE_ 1
#define P_WAKE_
#define C_REPEAT 0
#define P_WANTS_CREDIT (p_com < MAXREC && p_com == p_rel + N)
#endif
/* A credit record the owner owes: credit (lazy, or asked for), the flag cleared after a doorbell,
 * or (REPEAT_ANSWER) a notifying record for a request that may have crossed a plain one */
#define CREDIT_OWED ((c_rel > c_cred && (c_asked || c_rel - c_cred >= CTHRESH)) || c_clr || C_REPEAT)
#else
#define AWAKE_ 1
#define CQ_POLL_OK 1
#define P_AWAKE_ 1
#define P_WAKE_
#define P_WANTS_CREDIT (p_com < MAXREC && p_com == p_rel + N)
#endif

#if SESSION
/* ---- the ring owner's session table (SessionTable) and the producer's side of it ---- */
#define T_WAIT   0  /* attached / resuming: the epoch's QP has not reached ESTABLISHED */
#define T_CONN   1  /* connected */
#define T_BROKEN 2  /* broken: the epoch's QP died */
byte t_st = T_CONN;  /* the session's state; its epoch is `epoch` (the owner's begin_epoch uses it) */
byte t_unconf = 0;   /* U, the epoch a retried resume may come from; 0 = none */
byte g_unconf = 0;   /* ghost: U as the rules define it (the mutants change only t_unconf) */
byte p_ep = 1;       /* the producer core's epoch: its WRITEs and records carry it */
byte rp_ep = 0;      /* a grant on its way to the producer (its epoch; 0 = none) ... */
byte rp_pos, rp_rel; /* ... and its resume point */
byte p_cn = 0;       /* the producer's connect request on its way (its epoch; 0 = none) */
bit  p_stuck = 0;    /* every resume the producer may send was refused: it gave up */
byte replays = 0;
/* Protocol v4's control connections (sessions.md §2, §3). The owner's hello gives every new
 * connection a fresh nonce (here the next value of a counter: fresh is all that matters); every
 * resume carries a counter, per connection, from 1, and its proof covers the counter and the
 * connection's nonce. The owner checks the proof with its own connection's nonce; the model
 * carries the nonce the proof was made for, and compares it. The owner keeps, per connection,
 * its nonce and the last counter it accepted there. */
byte nonces = 1;     /* the last nonce the owner gave out; the producer's first connection has 1 */
byte p_nc = 1;       /* producer: the nonce of its control connection ... */
byte p_ctr = 0;      /* ... and the counter of the last message it sent on it */
byte o_pn = 1;       /* owner: the nonce it gave the producer's connection ... */
byte o_pl = 0;       /* ... and the last counter it accepted on that connection */
bit  g_rgrant = 0;   /* ghost: the replayer (a third party) holds a grant */
/* A connection a third party opened: its own fresh nonce, which no producer connection has
 * (a constant above every producer nonce: 1 + MAXLOST at most), and no counter accepted on it */
#define RNONCE 200
byte lost = 0;
#define PEP p_ep
#define CREDIT_LINK (up && t_st == T_CONN)
#else
#define PEP epoch
#define CREDIT_LINK 1
#endif

/* A WRITE of the record at `pos` reaches the ring. The rkey is checked: a resume re-keys the
 * ring, so a WRITE of an older epoch is refused and changes nothing. */
inline place(e, pos, inc) {
  if
  :: e == epoch ->
       /* P3: a WRITE lands only in space the consumer released (the slot's previous lap) */
       assert(pos < c_rel + N);
#ifndef NO_P8
       /* P8: nothing lands on a record the consumer may read or is reading, [released, mark),
        * except the same record again (a resumed producer sends the same bytes again) */
       assert(ring[pos % N] == 0 || ring[pos % N] - 1 < c_rel || ring[pos % N] - 1 >= c_mark ||
              (ring[pos % N] - 1 == pos && ring_inc[pos % N] == inc));
#endif
       ring[pos % N] = SEQ(pos);
       ring_inc[pos % N] = inc
  :: else -> skip
  fi
}

inline place_pending(k) {
  atomic {
    pd_valid[k] ->
      if
      :: pd_ep[k] == epoch -> npend_cur--
      :: else -> skip
      fi;
      place(pd_ep[k], pd_pos[k], pd_inc[k]);
      pd_valid[k] = 0; pd_ep[k] = 0; pd_pos[k] = 0; pd_inc[k] = 0;
      npend--
  }
}

/* on_credit() would take the credit MR's record: released moves, or (mode tail, its epoch) the
 * flag differs from D */
#if SLEEP && MODE == TAIL
#define CREDIT_NEWS (cm_valid && (!CREDIT_EPOCH || cm_ep == PEP) && \
                     (cm_rel > p_rel || (cm_ep == PEP && cm_flag != p_door)))
#else
#define CREDIT_NEWS (cm_valid && (!CREDIT_EPOCH || cm_ep == PEP) && cm_rel > p_rel)
#endif

active proctype producer() {
  byte pos;
end:
  do
  :: atomic { /* claim + commit one record into staging */
       up && !p_dead && P_AWAKE_ && p_com < MAXREC && p_com < p_rel + N -> p_com++ }
  :: atomic { /* claim refused for lack of space: ask for credit, one request outstanding (DRAIN:
               * or drain() asks, everything committed, not all released) */
       up && !p_dead && P_AWAKE_ && P_WANTS_CREDIT && !p_asked && !p_want -> p_want = 1 }
#if SLEEP && MODE == TAIL && FLAG_FIRST
  :: atomic { /* MUTANT: the doorbell flag is read before the publish is posted */
       up && !p_dead && P_AWAKE_ && !p_rd && (p_com > p_pub || p_want || p_ring) -> p_dbr = p_door; p_rd = 1 }
#endif
#if SLEEP && MODE == TAIL
  :: atomic { /* take_batch(): [published, committed), the tail record and, when the consumer's
               * flag is set or a doorbell is owed, the doorbell, in order, on one QP */
       up && !p_dead && P_AWAKE_ && (p_com > p_pub || p_want || p_ring) &&
       len(qp) + p_com - p_pub + 2 <= QCAP && FLAG_READ ->
#else
  :: atomic { /* take_batch(): [published, committed) and the publish, in order, on one QP */
       up && !p_dead && P_AWAKE_ && (p_com > p_pub || p_want) && len(qp) + p_com - p_pub + 1 <= QCAP ->
#endif
       pos = p_pub;
       do
       :: (MODE == IMM && pos + 1 < p_com) || (MODE == TAIL && pos < p_com) ->
            qp!WR(PEP, pos, p_inc, 0, 0); pos++
       :: else -> break
       od;
       if
       :: MODE == IMM && p_com > p_pub ->  /* the last segment is the WRITE_WITH_IMM itself */
            qp!WIMM(PEP, pos, p_inc, p_com, p_want)
       :: MODE == IMM && p_com == p_pub -> /* zero-length: a credit request alone */
            qp!WIMM(PEP, NONE, p_inc, p_com, p_want)
       :: MODE == TAIL ->
            if
            :: p_want -> p_creq++
            :: else -> skip
            fi;
            qp!WTAIL(PEP, NONE, p_inc, p_com, p_creq)
#if SLEEP && MODE == TAIL
            ;
            /* publish, then read the flag, then the doorbell (a zero-length WRITE_WITH_IMM after
             * the tail write on the same QP); the mutant FLAG_FIRST read it before posting */
            if
#if FLAG_FIRST
            :: p_dbr || p_ring ->
#else
            :: p_door || p_ring ->
#endif
                 /* its immediate's tail bits are never checked (the tail record is
                  * authoritative): the model carries 0 there */
                 qp!WIMM(PEP, NONE, 0, 0, 0); p_ring = 0
            :: else -> skip
            fi
#if FLAG_FIRST
            ; p_rd = 0; p_dbr = 0
#endif
#endif
       fi;
       if
       :: p_want -> p_want = 0; p_asked = 1
       :: else -> skip
       fi;
       p_pub = p_com;
       pos = 0 }
#if SLEEP && MODE == TAIL
  :: atomic { /* on_credit(): a new credit record: released moves, or (its epoch) the flag changes.
               * The flag sets the doorbell state; the repair rule: a flag set while released is
               * below what was published owes a doorbell (posted with the next batch, which may
               * carry only the tail record again). The producer reads its credit MR at any step
               * (PSLEEP: at any step it is awake) */
       up && !p_dead && P_AWAKE_ && CREDIT_NEWS ->
       if
       :: cm_ep == PEP ->
            p_door = cm_flag;
            if
            :: !NO_REPAIR && cm_flag && cm_rel < p_pub -> p_ring = 1
            :: else -> skip
            fi
       :: else -> skip
       fi;
       if
       :: cm_rel > p_pub -> p_dead = 1   /* protocol violation */
       :: cm_rel > p_rel ->
#ifndef NO_P4
            assert(cm_ep == epoch);      /* P4 */
#endif
            p_rel = cm_rel; p_asked = 0
       :: else -> skip                   /* the flag alone */
       fi }
#else
  :: atomic { /* on_credit(): a credit record that would move released (PSLEEP: when awake) */
       up && !p_dead && P_AWAKE_ && CREDIT_NEWS ->
       if
       :: cm_rel > p_pub -> p_dead = 1   /* protocol violation */
       :: else ->
#ifndef NO_P4
            assert(cm_ep == epoch);      /* P4 */
#endif
            p_rel = cm_rel; p_asked = 0
       fi }
#endif
#if PSLEEP && !NO_REPOLL
  :: atomic { /* Producer::wait(), P6 steps 1-4: waiting for credit, everything posted (step 1),
               * it polls its CQ empty and reads its credit MR, arms the CQ, polls and reads again:
               * nothing new (news: on_credit above takes it first, and the producer decides
               * again), so it is asleep. Step 5: the fabric wakes it (an event of the armed CQ,
               * a notifying record's receive completion, or a drop's error completions); woken,
               * it polls, and reads the credit MR at any step (on_credit) */
       P_MAY_SLEEP && !CREDIT_NEWS -> p_slp = P_ASLEEP }
#elif PSLEEP
  :: atomic { /* steps 1-2: everything posted, it polls its CQ empty and reads its credit MR:
               * nothing new */
       P_MAY_SLEEP && !CREDIT_NEWS -> p_rcv = 0; p_slp = P_POLLED }
  :: atomic { /* MUTANT: step 3, it arms its CQ, and sleeps without step 4: a completion queued
               * since its poll raises no event */
       p_slp == P_POLLED -> p_ev = 0; p_slp = P_ASLEEP }
  :: atomic { /* step 5: an event of the armed CQ ends the sleep; woken, it polls */
       p_slp == P_ASLEEP && p_ev -> p_rcv = 0; p_ev = 0; p_slp = P_AWAKE }
#endif
  od
}

active proctype fabric() {
  byte e, pos, i, t, r, k;
end:
  do
  :: atomic { /* the responder executes a payload WRITE */
       qp?[WR, _, _, _, _, _] && npend < PCAP ->
       qp?WR(e, pos, i, t, r);
       if
       :: e != epoch -> skip                 /* stale rkey: refused */
       :: e == epoch && !RELAXED -> place(e, pos, i)
       :: e == epoch && RELAXED ->           /* becomes visible later, in any order */
            k = 0;
            do
            :: k < PCAP - 1 && pd_valid[k] -> k++
            :: else -> break
            od;
            pd_valid[k] = 1; pd_ep[k] = e; pd_pos[k] = pos; pd_inc[k] = i;
            npend++; npend_cur++
       fi;
       e = 0; pos = 0; i = 0; t = 0; r = 0; k = 0 }
  :: atomic { /* WRITE_WITH_IMM: the receive completion is generated only once its own data and
               * that of every earlier WRITE of the QP is placed (RC; publish-modes.md I3) */
       qp?[WIMM, _, _, _, _, _] && npend_cur == 0 && nfull(cq) ->
       qp?WIMM(e, pos, i, t, r);
       if
       :: e == epoch ->
            if
            :: pos != NONE -> place(e, pos, i)
            :: else -> skip
            fi;
            cq!e, t, r
       :: else -> skip                       /* stale rkey: refused, no completion */
       fi;
       e = 0; pos = 0; i = 0; t = 0; r = 0 }
  :: atomic { /* tail-record WRITE: the tail MR is never relaxed, so it is placed when executed;
               * a relaxed payload WRITE before it may still be unplaced */
       qp?[WTAIL, _, _, _, _, _] ->
       qp?WTAIL(e, pos, i, t, r);
       if
       :: e == epoch -> tm_valid = 1; tm_ep = e; tm_tail = t; tm_creq = r
       :: else -> skip
       fi;
       e = 0; pos = 0; i = 0; t = 0; r = 0 }
  :: place_pending(0)
  :: place_pending(1)
  :: place_pending(2)
  :: place_pending(3)
#if PSLEEP
  :: atomic { /* a credit WRITE lands in the producer's credit MR (its completion: cr empties); a
               * WRITE_WITH_IMM (notifying) also makes a receive completion in the producer's CQ
               * (a receive is always posted, P7; the immediate carries nothing) */
       cr?e, t, r, k ->
       if
       :: e == epoch -> cm_valid = 1; cm_ep = e; cm_rel = t; cm_flag = r;
            if
#if NO_REPOLL
            :: k ->
                 p_rcv = 1;
                 if
                 :: p_slp == P_ASLEEP -> p_ev = 1  /* armed: a new completion is an event */
                 :: else -> skip
                 fi
#else
            :: k && p_slp == P_ASLEEP -> p_slp = P_AWAKE  /* an event of the armed CQ: it wakes */
#endif
            :: else -> skip
            fi
       :: else -> skip
       fi;
       e = 0; t = 0; r = 0; k = 0 }
#elif SLEEP
  :: atomic { /* a credit WRITE lands in the producer's credit MR (its completion: cr empties) */
       cr?e, t, r ->
       if
       :: e == epoch -> cm_valid = 1; cm_ep = e; cm_rel = t; cm_flag = r
       :: else -> skip
       fi;
       e = 0; t = 0; r = 0 }
#else
  :: atomic { /* a credit WRITE lands in the producer's credit MR */
       cr?e, t ->
       if
       :: e == epoch -> cm_valid = 1; cm_ep = e; cm_rel = t
       :: else -> skip
       fi;
       e = 0; t = 0 }
#endif
  od
}

active proctype consumer() {
  byte e, t, s;
  bit r;
#if PSLEEP
  bit k;   /* the credit record being written is notifying */
#endif
end:
  do
#if MODE == IMM
  :: atomic { /* on_immediate(): poll a receive completion (SLEEP: any completion wakes the owner) */
       c_viol == 0 && nempty(cq) && CQ_POLL_OK ->
       cq?e, t, r;
#if SLEEP
       c_slp = AWAKE;
#endif
#if SLEEP && NO_REDRAIN
       c_cqn = 0;
#endif
       if
       :: e != epoch -> skip   /* a completion of an earlier link in the shared CQ: recognised
                                * by qp_num and ignored (resume.md §3). The epoch bits (V_EPOCH)
                                * are checked only on the current QP's, where they always match */
       :: e == epoch && (t < c_mark || t - c_cred > N) -> c_viol = V_RANGE
       :: else ->
            assert(e == epoch);   /* P4 */
            c_mark = t;
            if
            :: r -> c_asked = 1
            :: else -> skip
            fi
       fi;
       e = 0; t = 0; r = 0 }
#else
  :: atomic { /* on_tail(): poll the tail MR; a record of another epoch is ignored */
       c_viol == 0 && AWAKE_ && TAIL_NEWS ->
       if
       :: tm_tail < c_cred || tm_tail - c_cred > N -> c_viol = V_RANGE
       :: else ->
#ifndef NO_P4
            assert(tm_ep == epoch);   /* P4 */
#endif
            if
            :: tm_tail > c_mark -> c_mark = tm_tail
            :: else -> skip
            fi;
            if
            :: tm_creq != c_seen -> c_seen = tm_creq; c_asked = 1
            :: else -> skip
            fi
       fi }
#if SLEEP
  :: atomic { /* on_doorbell(): poll a doorbell's receive completion; any completion wakes the
               * owner. One of this epoch (epoch bits checked, they always match here) only says
               * "read the tail MR now", and clears the flag if the last credit record set it */
       c_viol == 0 && nempty(cq) ->
       cq?e, t, r;
       c_slp = AWAKE;
       if
       :: e == epoch && c_flag -> c_clr = 1
       :: else -> skip   /* no flag to clear, or an earlier link's completion (ignored by qp_num) */
       fi;
       e = 0; t = 0; r = 0 }
#endif
#endif
  :: atomic { /* next(): the record at head, below the mark */
       c_viol == 0 && AWAKE_ && c_head < c_mark ->
       s = c_head % N;
       if
       :: CHECK && ring[s] != SEQ(c_head) ->
            /* P5: under the mode's guarantee a record below the mark is complete */
            assert(NOTREADY_OK || ring[s] == SEQ(c_head));
            if
            :: MODE == IMM -> c_viol = V_CHECK   /* at once */
            :: MODE == TAIL -> skip              /* not ready: retried at a later poll */
            :: MODE == TAIL -> c_viol = V_GRACE  /* ordering_grace ran out */
            fi
       :: else ->
            /* P1: the slot holds the expected record, placed, as the current producer sent it */
            assert(ring[s] == SEQ(c_head) && ring_inc[s] == p_inc);
            /* P2: in order, never twice, over all epochs */
            assert(ring[s] > g_last);
            g_last = ring[s];
            c_head++; c_del = c_head
       fi;
       s = 0 }
  :: atomic { /* the application releases the oldest delivered record */
       AWAKE_ && c_rel < c_del -> c_rel++ }
#if SLEEP
  :: atomic { /* take_credit(): lazily, at once when asked, or to clear the flag after a doorbell
               * (released may be unchanged); the flag of every other record stays as it is.
               * A record that leaves released unchanged does not answer a pending credit
               * request (wakeup.md O2; CLEAR_ASK: it does, as ConsumerCore::take_credit had it) */
       c_viol == 0 && AWAKE_ && CREDIT_LINK && CREDIT_OWED && nfull(cr) ->
       if
       :: c_clr -> c_flag = 0; c_clr = 0
       :: else -> skip
       fi;
#if PSLEEP
       /* O6: notifying (WRITE_WITH_IMM) when it answers a request (released moves while one is
        * pending), or (REPEAT_ANSWER) when a request is pending and the last record that moved
        * released was plain; else a plain WRITE (lazy credit, a clear). ANSWER_PLAIN: always
        * plain. (Setting the flag is the sleep step's, below.) */
       if
       :: !ANSWER_PLAIN && c_asked && (c_rel > c_cred || C_REPEAT) -> k = 1; c_plain = 0
       :: else ->
            k = 0;
            if
            :: c_rel > c_cred -> c_plain = 1
            :: else -> skip
            fi
       fi;
#endif
       if
       :: CLEAR_ASK || c_rel > c_cred -> c_asked = 0
       :: else -> skip
       fi;
#if PSLEEP
       CR_SEND(c_rel, c_flag, k); c_cred = c_rel; k = 0 }
#else
       CR_SEND(c_rel, c_flag, 0); c_cred = c_rel }
#endif
  :: atomic { /* RingOwner::wait, when nothing is pending (the application released all it read,
               * no credit owed, no completion, nothing unread, tail MR unchanged). Mode tail: a
               * credit record with the flag set, unless the last one carried it (only over a
               * live, established link); mode imm: arm the CQ, re-drain it (empty: asleep) */
       SLEEP && AWAKE_ && sleeps < MAXSLEEP && c_viol == 0 && c_head == c_mark && c_rel == c_del &&
       !CREDIT_OWED && empty(cq) && SLEEP_MODE_OK ->
       sleeps++;
#if MODE == TAIL
       if
       :: !c_flag && CREDIT_LINK && !NO_FLAG ->
            c_flag = 1;
#if PSLEEP
            /* O6: it sets the flag, so it is notifying (FLAG_PLAIN: only if it also answers a
             * request) */
            if
            :: !FLAG_PLAIN || (!ANSWER_PLAIN && c_asked && (c_rel > c_cred || C_REPEAT)) -> k = 1; c_plain = 0
            :: else ->
                 k = 0;
                 if
                 :: c_rel > c_cred -> c_plain = 1
                 :: else -> skip
                 fi
            fi;
#endif
            if
            :: CLEAR_ASK || c_rel > c_cred -> c_asked = 0
            :: else -> skip
            fi;
#if PSLEEP
            CR_SEND(c_rel, 1, k); c_cred = c_rel; k = 0
#else
            CR_SEND(c_rel, 1, 0); c_cred = c_rel
#endif
       :: else -> skip
       fi;
       c_slp = FLAGGING
#elif NO_REDRAIN
       c_slp = ARMING
#else
       c_slp = ASLEEP   /* drained, armed, re-drained: one step (a completion is an event) */
#endif
       }
#if MODE == IMM && NO_REDRAIN
  :: atomic { /* MUTANT: arm the CQ after the drain, sleep without draining again: the
               * completions already queued raise no event */
       c_slp == ARMING -> c_cqn = len(cq); c_slp = ASLEEP }
#endif
#if MODE == TAIL
  :: atomic { /* the re-check, once the flag write has completed (every credit write before it
               * has landed too: one QP); SLEEP_UNCONFIRMED: at once. The tail MR moved: stay
               * awake; else asleep (a doorbell in the CQ wakes it at once) */
       c_slp == FLAGGING && (SLEEP_UNCONFIRMED || empty(cr)) ->
       if
       :: TAIL_NEWS -> c_slp = AWAKE
       :: else -> c_slp = ASLEEP
       fi }
#endif
#else
  :: atomic { /* take_credit(): lazily, or at once when asked (SESSION: only over the current
               * link, live and established: RingOwner's return_credit) */
       c_viol == 0 && CREDIT_LINK && c_rel > c_cred && (c_asked || c_rel - c_cred >= CTHRESH) && nfull(cr) ->
       cr!epoch, c_rel; c_cred = c_rel; c_asked = 0 }
#endif
  od
}

#if !SESSION
/* Drops and resumes. The choice at the start keeps runs that never drop, so that the
 * watchdog can see a stall: a drop that is always possible would hide it. */
active proctype connection() {
  byte k;
  if
  :: goto done      /* this run never drops */
  :: MAXDROP > 0    /* this run drops */
  fi;
end:
  do
  :: atomic { up && drops < MAXDROP -> up = 0; drops++ P_WAKE_ }
  :: atomic {
       !up ->
       /* The old link is destroyed and the ring and tail MR re-registered (resume.md steps
        * 6-7): from here a WRITE of the old epoch is refused (the fabric compares its epoch
        * with `epoch`). ConsumerCore::begin_epoch(epoch + 1): forget what was published but
        * not read (the producer sends it again); what is being consumed stays so until
        * released; credit request flag and failure cleared, credit_requests_seen kept. */
       epoch++; up = 1;
       npend_cur = 0;
       c_mark = c_head; c_cred = c_rel; c_asked = 0; c_viol = 0;
       if
       :: SEEN_RESET -> c_seen = 0
       :: else -> skip
       fi;
       if
       :: ZERO_ON_RESUME ->
          k = c_head;
          do
          :: k < c_rel + N -> ring[k % N] = 0; ring_inc[k % N] = 0; k++
          :: else -> break
          od;
          k = 0
       :: else -> skip
       fi;
       /* ResumePoint {epoch, position = head, released, next_sequence = SEQ(head)}, which the
        * producer must accept: ProducerCore::resume()'s checks (P7) */
       assert(c_rel <= c_head && p_rel <= c_head && c_head <= p_pub);
       if
       :: /* ProducerCore::resume(): keeps its staging, sends [head, committed) again */
          if
          :: c_rel > p_rel -> p_rel = c_rel
          :: else -> skip
          fi;
          p_pub = c_head
       :: RESTART ->
          /* the producer process died: a new one starts empty at the resume point, and its
           * application sends new records from there (same positions, same sequences) */
          p_inc++;
          p_rel = c_rel; p_pub = c_head; p_com = c_head; p_creq = 0
       fi;
       p_want = 0; p_asked = 0; p_dead = 0;
#if SLEEP
       /* a new epoch: both sides start with the flag set (mode tail), nothing owed; the control
        * event wakes the owner */
       SLEEP_EPOCH; PRODUCER_SLEEP_EPOCH;
#endif
       /* Left as they are, as replays of old control messages the new epoch must ignore: the
        * old link's completions in the shared CQ (mode imm), the old epoch's last credit record
        * in the credit MR (kept across a resume), and the old epoch's last tail record in the
        * tail MR (resume.md zeroes it; to the consumer, an ignored old record is the same) */
       skip }
  :: drops == MAXDROP && up -> break
  od;
done:
  skip
}
#else
/* ---- SESSION: the owner's session table, the producer's recover(), replays ---- */

#if ADMIT_STALE
#define ADMITS_RESUME(e)  ((e) >= 1 && (e) <= epoch)
#define ADMITS_CONNECT(e) ((e) >= 1 && (e) <= epoch && t_st == T_WAIT)
#elif RETRY_RANGE
#define ADMITS_RESUME(e)  ((e) == epoch || (t_unconf != 0 && (e) >= t_unconf))
#define ADMITS_CONNECT(e) ((e) == epoch && t_st == T_WAIT)
#else
/* SessionTable::resume: the current epoch, or U (a retry); admit_connect: the current epoch,
 * while its QP has not reached ESTABLISHED */
#define ADMITS_RESUME(e)  ((e) == epoch || (t_unconf != 0 && (e) == t_unconf))
#define ADMITS_CONNECT(e) ((e) == epoch && t_st == T_WAIT)
#endif
/* The owner's replay check (protocol v4, sessions.md §3): a message proved for nonce n, counter k,
 * arriving over a connection whose nonce is cn and where the last counter accepted is cl, passes
 * only if n = cn and k > cl; else badProof, before its epoch is looked at. Accepted, k becomes
 * the connection's last. NO_NONCE, NO_COUNTER: the mutants leave out one comparison each. */
#define FRESH(n, k, cn, cl) ((NO_NONCE || (n) == (cn)) && (NO_COUNTER || (k) > (cl)))

/* The rules (sessions.md §7): a message of an epoch older than the current one, other than U,
 * is stale (RETRY_RANGE: older than U). U by the rules is g_unconf, which no mutant changes. */
#if RETRY_RANGE
#define STALE(e) ((e) < epoch && !(g_unconf != 0 && (e) >= g_unconf))
#else
#define STALE(e) ((e) < epoch && !(g_unconf != 0 && (e) == g_unconf))
#endif

/* P9's view of everything a stale message must leave as it is */
#define RING_STATE (ring[0] + 8 * ring[1] + 64 * ring[2] + 512 * ring[3] + \
                    4096 * (ring_inc[0] + ring_inc[1] + ring_inc[2] + ring_inc[3]))
#define SNAPSHOT s_ring = RING_STATE; s_mark = c_mark; s_head = c_head; s_rel = c_rel; s_cred = c_cred; \
                 s_ep = epoch; s_st = t_st; s_un = t_unconf; s_up = up
#define UNCHANGED (s_ring == RING_STATE && s_mark == c_mark && s_head == c_head && s_rel == c_rel && \
                   s_cred == c_cred && s_ep == epoch && s_st == t_st && s_un == t_unconf && s_up == up)

/* An admitted resume, from the current epoch or from U: Service::resume's table.resume, then
 * fence (drop the link: the QP of this epoch, whoever holds it, is destroyed; old rkeys revoked;
 * forget_unread zeroes [head, released + N)), then ConsumerCore::begin_epoch(epoch + 1):
 * published = head, credited = released, request flag, credit_requests_seen and failure cleared.
 * The grant carries {epoch, head, released, SEQ(head)}. */
inline owner_resume(e) {
  if
  :: e == epoch -> t_unconf = epoch; g_unconf = epoch
  :: else -> skip                       /* a retry keeps the fallback it had */
  fi;
  up = 0 P_WAKE_;
  epoch++; t_st = T_WAIT;
  npend_cur = 0;
  c_mark = c_head; c_cred = c_rel; c_asked = 0; c_viol = 0; c_seen = 0;
#if SLEEP
  SLEEP_EPOCH;
#endif
  k = c_head;
  do
  :: k < c_rel + N -> ring[k % N] = 0; ring_inc[k % N] = 0; k++
  :: else -> break
  od;
  k = 0
}

active proctype connection() {
  byte k, e, s_mark, s_head, s_rel, s_cred, s_ep, s_st, s_un;
  byte mn, mc, cn, cl;  /* a replay's nonce and counter; its connection's nonce and last counter */
  short s_ring;
  bit s_up;
  /* Runs that never drop, or never replay, so that the watchdog can see a stall: a drop or a
   * replay that is always possible would hide it. */
  if
  :: drops = MAXDROP
  :: skip
  fi;
  if
  :: replays = MAXREPLAY
  :: skip
  fi;
end:
  do
  :: atomic { /* the producer's QP dies; the owner marks a connected session broken */
       up && drops < MAXDROP -> up = 0; drops++ P_WAKE_;
       if
       :: t_st == T_CONN -> t_st = T_BROKEN
       :: else -> skip
       fi }
  :: atomic { /* Producer::recover(): a resume request signed for its core's epoch (with FALLBACK,
               * refused, for each earlier one), each over its control connection with its next
               * counter; the owner answers it at once: the replay check, then the table */
       !up && rp_ep == 0 && p_cn == 0 && !p_stuck ->
       e = p_ep;
       do
       :: p_ctr++;
          if
          :: FRESH(p_nc, p_ctr, o_pn, o_pl) -> o_pl = p_ctr
          :: else -> p_stuck = 1; break    /* badProof: never (its own nonce, its next counter) */
          fi;
          if
          :: ADMITS_RESUME(e) ->
               owner_resume(e);
               rp_ep = epoch; rp_pos = c_head; rp_rel = c_rel;
               break
          :: else ->
               if
               :: FALLBACK && e > 1 -> e--
               :: else -> p_stuck = 1; break  /* staleEpoch: the session is lost to it */
               fi
          fi
       od;
       e = 0 }
  :: atomic { /* the reply is lost: the call times out, the control client drops the connection,
               * and its next call opens a new one, whose hello gets a fresh nonce */
       rp_ep != 0 && lost < MAXLOST ->
       rp_ep = 0; rp_pos = 0; rp_rel = 0; lost++;
       nonces++; p_nc = nonces; p_ctr = 0; o_pn = nonces; o_pl = 0 }
  :: atomic { /* the grant arrives: ProducerCore::resume(at), then a connect request for its epoch */
       rp_ep != 0 ->
       assert(rp_ep > p_ep && rp_rel <= rp_pos && p_rel <= rp_pos && rp_pos <= p_pub);   /* P7 */
       if
       :: rp_rel > p_rel -> p_rel = rp_rel
       :: else -> skip
       fi;
       p_pub = rp_pos; p_ep = rp_ep; p_creq = 0;
       p_want = 0; p_asked = 0; p_dead = 0;
#if SLEEP
       PRODUCER_SLEEP_EPOCH;
#endif
       p_cn = rp_ep; rp_ep = 0; rp_pos = 0; rp_rel = 0 }
  :: atomic { /* the connect request reaches the owner: admit_connect; refused, the producer has
               * no QP and resumes again */
       p_cn != 0 ->
       if
       :: ADMITS_CONNECT(p_cn) -> up = 1
       :: else -> skip
       fi;
       p_cn = 0 }
  :: atomic { /* ESTABLISHED at the owner: on_connected (the producer may have written before) */
       up && t_st == T_WAIT ->
       t_st = T_CONN; g_unconf = 0;
       if
       :: !KEEP_UNCONF -> t_unconf = 0
       :: else -> skip
       fi }
  :: atomic { /* LATE: a resume request of the producer's own, naming an older epoch, arrives late:
               * its call timed out, the control client dropped that connection and asked again
               * over a new one (sessions.md §2.1), but the owner still reads the first. Its nonce
               * is that of the connection it arrives on and its counter is above every one the
               * owner accepted there (the call that timed out was the last on it): the replay
               * check passes it, and the table decides, as it would the producer's. (The timeout
               * and the new connection behind it are left implicit: the producer's own requests
               * pass the check on whichever connection they use.) */
       LATE && replays < MAXREPLAY && epoch > 1 ->
       replays++;
       e = 1;
       do
       :: e + 1 < epoch -> e++
       :: break
       od;
       SNAPSHOT;
       if
       :: ADMITS_RESUME(e) -> owner_resume(e)  /* the grant goes back over a dropped connection */
       :: else -> skip
       fi;
       assert(!STALE(e) || UNCHANGED);      /* P9 */
#ifdef PROBE_WINDOW
       /* A probe, not a property: it fails once a late request admitted in the retry window
        * fences a QP the producer is using (the run that shows the window is reached, run 24) */
       assert(!(s_up && s_ep != epoch));
#endif
       e = 0; s_ring = 0; s_mark = 0; s_head = 0; s_rel = 0; s_cred = 0; s_ep = 0; s_st = 0; s_un = 0; s_up = 0 }
  :: atomic { /* a third party replays a resume request it captured on the producer's connection:
               * that connection's nonce and a counter the owner accepted there, naming any epoch
               * up to the current one. (One of the current epoch is one it took off the wire
               * before the owner read it; letting it name any epoch only makes it stronger.) It
               * sends it over its own connection (nonce RNONCE, no counter accepted yet; the
               * captured nonce is that of one of the producer's connections, none of which is
               * RNONCE), or injects it into the producer's connection it was captured on (plain
               * TCP; the last counter accepted there: an earlier one fails the same way). The
               * owner's replay check, then the table. (A counter that passes would become its
               * connection's last; the model keeps none: the replayer's connection carries this
               * one message, and an injected counter is never above the producer's last.) */
       replays < MAXREPLAY && epoch > 1 ->
       replays++;
       e = 1;
       do
       :: break
       :: e < epoch -> e++
       od;
       SNAPSHOT;
       if
       :: mn = p_nc; mc = 1; cn = RNONCE; cl = 0          /* over its own connection */
       :: o_pl > 0 -> mn = p_nc; mc = o_pl; cn = o_pn; cl = o_pl   /* into the producer's */
       fi;
       if
       :: FRESH(mn, mc, cn, cl) && ADMITS_RESUME(e) ->
            owner_resume(e); g_rgrant = 1   /* fenced; the grant goes to the replayer */
       :: else -> skip                      /* badProof (a replay), or staleEpoch */
       fi;
       assert(!g_rgrant);                   /* P10 */
       assert(!STALE(e) || UNCHANGED);      /* P9 */
       e = 0; mn = 0; mc = 0; cn = 0; cl = 0; s_ring = 0; s_mark = 0; s_head = 0; s_rel = 0;
       s_cred = 0; s_ep = 0; s_st = 0; s_un = 0; s_up = 0 }
  :: atomic { /* a connect request captured in an older epoch is replayed */
       replays < MAXREPLAY && epoch > 1 ->
       replays++;
       e = 1;
       do
       :: e + 1 < epoch -> e++
       :: break
       od;
       SNAPSHOT;
       if
       :: ADMITS_CONNECT(e) -> up = 0 P_WAKE_  /* its QP would replace the producer's */
       :: else -> skip
       fi;
       assert(!STALE(e) || UNCHANGED);      /* P9 */
       e = 0; s_ring = 0; s_mark = 0; s_head = 0; s_rel = 0; s_cred = 0; s_ep = 0; s_st = 0; s_un = 0; s_up = 0 }
  od
}
#endif

/* P6: when nothing can move any more, unless a side failed, every position was committed,
 * published and delivered (no credit deadlock, publish-modes.md §6.2). */
active proctype watchdog() {
  timeout ->
    assert(c_viol != 0 || p_dead || (p_com == MAXREC && p_pub == p_com && c_head == p_com && (!DRAIN || p_rel == p_com)))
}
