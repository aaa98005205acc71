/*
 * rdmaring v1 publish protocol: one producer, one consumer, the fabric between them.
 * See README.md next to this file for what is modelled, what is abstracted and the runs.
 *
 * Configuration (each a macro, set with spin -DNAME=VALUE):
 *   MODE          1 = imm (RDMA_WRITE_WITH_IMM publishes), 2 = tail (tail-record WRITE publishes)
 *   RELAXED       1 = the ring MR is registered with relaxed ordering: the fabric may place the
 *                 payload WRITEs of one QP late, in any order, after later WRITEs
 *   CHECK         1 = the consumer checks each record below the mark (exact expected sequence;
 *                 stands for header CRC, kind, length, payload CRC and sequence, wire-formats.md
 *                 §2.4). 0 = it trusts the publish mark (what naive implementations do)
 *   NOTREADY_OK   0 = assert that a record below the mark never fails its check (the guarantee
 *                 publish-modes.md I3 / §3.2 claims); 1 = a failing check is allowed (it must
 *                 then be waited out or reported, never delivered)
 *   RESEQ         1 = on reconnect the consumer announces a next_sequence above every sequence
 *                 the old connection can have left in the ring (failures.md §2); 0 = it continues
 *                 from the next sequence it expected
 *   CREDIT_EPOCH  1 = the producer ignores credit records of another epoch (wire-formats.md §5)
 *   TAIL_EPOCH    1 = the consumer ignores tail records of another epoch (wire-formats.md §4)
 *   MAXREC        records the producer commits over the whole run (all connections)
 *   MAXDROP       connection drops (each followed by a reconnect with epoch + 1)
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
#ifndef RESEQ
#define RESEQ 1
#endif
#ifndef CREDIT_EPOCH
#define CREDIT_EPOCH 1
#endif
#ifndef TAIL_EPOCH
#define TAIL_EPOCH 1
#endif
#ifndef MAXREC
#define MAXREC 6
#endif
#ifndef MAXDROP
#define MAXDROP 1
#endif

#define IMM  1
#define TAIL 2

#define N       4   /* ring slots; one record per slot, so positions count records */
#ifndef CTHRESH
#define CTHRESH 2   /* lazy credit threshold: released - credited >= ring / credit_fraction (2) */
#endif
#define QCAP    6   /* producer send queue: WRs posted and not yet executed by the responder */
#define PCAP    4   /* relaxed-ordering WRITEs executed but not yet placed */
#define CQCAP   3   /* consumer receive completions not yet polled */
#define CRCAP   2   /* consumer credit WRITEs not yet executed */
#define NONE    255 /* no ring position: a zero-length WRITE_WITH_IMM, a tail record */

/* consumer protocol violations (sticky) */
#define V_CHECK 1   /* mode imm: a record below the mark fails its check */
#define V_GRACE 2   /* mode tail: a record below the mark still fails after ordering_grace */
#define V_EPOCH 3   /* mode imm: an immediate whose epoch bits are not this connection's */
#define V_RANGE 4   /* a publish mark outside [credited, credited + ring] */

mtype = { WR, WIMM, WTAIL };

/* ---- connection ---- */
byte epoch = 0;    /* the connection's epoch; also the rkey generation of ring, tail and credit MRs */
bit  up = 1;       /* the connection is up */
byte drops = 0;
byte written = 0;  /* records committed so far, over all connections */

/* ---- consumer memory ---- */
byte ring[N];      /* sequence of the record placed in the slot; 0 = zeroed (sequences start at 1) */
byte ring_ep[N];   /* ghost: epoch of the connection whose WRITE placed it (records carry no epoch) */
bit  tm_valid;     /* tail MR: 0 = zeroed (fails its check) */
byte tm_ep, tm_tail, tm_creq;

/* ---- producer memory ---- */
bit  cm_valid;     /* credit MR: 0 = zeroed, never decoded */
byte cm_ep, cm_rel;

/* ---- fabric ---- */
chan qp = [QCAP] of { mtype, byte, byte, byte, byte, byte };  /* kind, epoch, pos, seq, tail, request */
chan cq = [CQCAP] of { byte, byte, bit };                      /* immediate: epoch bits, tail, credit request */
chan cr = [CRCAP] of { byte, byte };                           /* credit record: epoch, released */
bit  pd_valid[PCAP];                                           /* executed, not yet placed (relaxed) */
byte pd_ep[PCAP], pd_pos[PCAP], pd_seq[PCAP];
byte npend = 0;       /* number of valid pd_ entries */
byte npend_cur = 0;   /* ... of them, of the current epoch (derived) */

/* ---- producer core (positions in records) ---- */
byte p_rel, p_pub, p_com;
byte p_base = 1;   /* next_sequence from the accept: the sequence at position 0 */
bit  p_want, p_asked, p_dead;
byte p_creq;       /* tail record's credit_requests counter */

/* ---- consumer core ---- */
byte c_cred, c_rel, c_del, c_head, c_mark;
byte c_base = 1, c_exp = 1;  /* next_sequence announced; the next sequence to deliver */
bit  c_asked;
byte c_seen;       /* last credit_requests seen in a tail record */
byte c_viol = 0;
byte g_last = 0;   /* ghost: last sequence delivered, over all connections */

/* A WRITE's bytes become visible in the ring. The rkey is checked: the ring is registered anew
 * for each connection, so a WRITE of an older epoch is refused and changes nothing. */
inline place(e, pos, q) {
  if
  :: e == epoch ->
       /* P3: the producer overwrites a slot only once the consumer released its previous record */
       assert(pos < c_rel + N);
       ring[pos % N] = q;
       ring_ep[pos % N] = e
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
      place(pd_ep[k], pd_pos[k], pd_seq[k]);
      pd_valid[k] = 0; pd_ep[k] = 0; pd_pos[k] = 0; pd_seq[k] = 0;
      npend--
  }
}

active proctype producer() {
  byte pos;
end:
  do
  :: atomic { /* claim + commit one record into staging */
       up && !p_dead && written < MAXREC && p_com < p_rel + N -> p_com++; written++ }
  :: atomic { /* claim refused for lack of space: ask for credit, one request outstanding */
       up && !p_dead && written < MAXREC && p_com == p_rel + N && !p_asked && !p_want -> p_want = 1 }
  :: atomic { /* take_batch(): post [published, committed) and the publish, in order, on one QP */
       up && !p_dead && (p_com > p_pub || p_want) && len(qp) + p_com - p_pub + 1 <= QCAP ->
       pos = p_pub;
       do
       :: (MODE == IMM && pos + 1 < p_com) || (MODE == TAIL && pos < p_com) ->
            qp!WR(epoch, pos, p_base + pos, 0, 0); pos++
       :: else -> break
       od;
       if
       :: MODE == IMM && p_com > p_pub -> /* the last segment is the WRITE_WITH_IMM itself */
            qp!WIMM(epoch, pos, p_base + pos, p_com, p_want)
       :: MODE == IMM && p_com == p_pub -> /* zero-length: a credit request alone */
            qp!WIMM(epoch, NONE, 0, p_com, p_want)
       :: MODE == TAIL ->
            if
            :: p_want -> p_creq++
            :: else -> skip
            fi;
            qp!WTAIL(epoch, NONE, 0, p_com, p_creq)
       fi;
       if
       :: p_want -> p_want = 0; p_asked = 1
       :: else -> skip
       fi;
       p_pub = p_com;
       pos = 0 }
  :: atomic { /* on_credit(): a credit record that would move released */
       up && !p_dead && cm_valid && (!CREDIT_EPOCH || cm_ep == epoch) && cm_rel > p_rel ->
       if
       :: cm_rel > p_pub -> p_dead = 1   /* protocol violation (sticky) */
       :: else ->
#ifndef NO_P4
            assert(cm_ep == epoch);      /* P4: a stale epoch never moves the producer's released */
#endif
            p_rel = cm_rel; p_asked = 0
       fi }
  od
}

active proctype fabric() {
  byte e, pos, q, t, r, k;
end:
  do
  :: atomic { /* the responder executes a payload WRITE */
       qp?[WR, _, _, _, _, _] && npend < PCAP ->
       qp?WR(e, pos, q, t, r);
       if
       :: e != epoch -> skip                 /* stale rkey: refused */
       :: e == epoch && !RELAXED -> place(e, pos, q)
       :: e == epoch && RELAXED ->           /* placed later, in any order */
            k = 0;
            do
            :: pd_valid[k] -> k++
            :: else -> break
            od;
            pd_valid[k] = 1; pd_ep[k] = e; pd_pos[k] = pos; pd_seq[k] = q;
            npend++; npend_cur++
       fi;
       e = 0; pos = 0; q = 0; t = 0; r = 0; k = 0 }
  :: atomic { /* WRITE_WITH_IMM: its receive completion is generated only once its own data and
               * that of every earlier WRITE of the QP is placed (RC, publish-modes.md I3) */
       qp?[WIMM, _, _, _, _, _] && npend_cur == 0 && nfull(cq) ->
       qp?WIMM(e, pos, q, t, r);
       if
       :: e == epoch ->
            if
            :: pos != NONE -> place(e, pos, q)
            :: else -> skip
            fi;
            cq!e, t, r
       :: else -> skip                       /* stale rkey: refused, no completion */
       fi;
       e = 0; pos = 0; q = 0; t = 0; r = 0 }
  :: atomic { /* tail-record WRITE: the tail MR is never relaxed, it is placed when executed,
               * but a relaxed payload WRITE before it may still be unplaced */
       qp?[WTAIL, _, _, _, _, _] ->
       qp?WTAIL(e, pos, q, t, r);
       if
       :: e == epoch -> tm_valid = 1; tm_ep = e; tm_tail = t; tm_creq = r
       :: else -> skip
       fi;
       e = 0; pos = 0; q = 0; t = 0; r = 0 }
  :: place_pending(0)
  :: place_pending(1)
  :: place_pending(2)
  :: place_pending(3)
  :: atomic { /* the consumer's credit WRITE lands in the producer's credit MR */
       cr?e, t ->
       if
       :: e == epoch -> cm_valid = 1; cm_ep = e; cm_rel = t
       :: else -> skip
       fi;
       e = 0; t = 0 }
  od
}

active proctype consumer() {
  byte e, t, s;
  bit r;
end:
  do
#if MODE == IMM
  :: atomic { /* on_immediate(): poll a receive completion */
       c_viol == 0 && nempty(cq) ->
       cq?e, t, r;
       if
       :: e != epoch -> c_viol = V_EPOCH
       :: e == epoch && (t < c_mark || t - c_cred > N) -> c_viol = V_RANGE
       :: else ->
            assert(e == epoch);   /* P4: a stale epoch never moves the publish mark */
            c_mark = t;
            if
            :: r -> c_asked = 1
            :: else -> skip
            fi
       fi;
       e = 0; t = 0; r = 0 }
#else
  :: atomic { /* on_tail(): poll the tail MR; a record of another epoch is ignored */
       c_viol == 0 && tm_valid && (!TAIL_EPOCH || tm_ep == epoch) && (tm_tail > c_mark || tm_creq != c_seen) ->
       if
       :: tm_tail < c_cred || tm_tail - c_cred > N -> c_viol = V_RANGE
       :: else ->
#ifndef NO_P4
            assert(tm_ep == epoch);   /* P4: a stale epoch never moves the publish mark */
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
#endif
  :: atomic { /* next(): the record at head, below the mark */
       c_viol == 0 && c_head < c_mark ->
       s = c_head % N;
       if
       :: CHECK && ring[s] != c_exp ->
            /* P5: under the mode's guarantee a record below the mark is always complete */
            assert(NOTREADY_OK);
            if
            :: MODE == IMM -> c_viol = V_CHECK            /* at once */
            :: MODE == TAIL -> skip                       /* not ready: retry on a later poll */
            :: MODE == TAIL -> c_viol = V_GRACE           /* ordering_grace ran out */
            fi
       :: else ->
            /* P1: the slot holds exactly the expected record, placed by this connection */
            assert(ring[s] == c_exp && ring_ep[s] == epoch);
            /* P2: in order, never twice, over all connections */
            assert(ring[s] > g_last);
            g_last = ring[s];
            c_head++; c_del = c_head; c_exp++
       fi;
       s = 0 }
  :: atomic { /* the application releases the oldest delivered record */
       c_rel < c_del -> c_rel++ }
  :: atomic { /* take_credit(): lazily, or at once when asked */
       c_viol == 0 && c_rel > c_cred && (c_asked || c_rel - c_cred >= CTHRESH) && nfull(cr) ->
       cr!epoch, c_rel; c_cred = c_rel; c_asked = 0 }
  od
}

/* Drops and reconnects. The choice at the start keeps runs without a drop, so the watchdog
 * can see a stall (a drop would otherwise always be possible, and hide it). */
active proctype connection() {
  byte e, t, nseq;
  bit r;
  if
  :: goto done     /* this run never drops */
  :: MAXDROP > 0   /* this run drops (at some point) */
  fi;
end:
  do
  :: atomic { up && drops < MAXDROP -> up = 0; drops++ }
  :: atomic {
       /* a new connection on the same ring, once the application released what it holds */
       !up && c_rel == c_del && c_viol == 0 ->
       epoch++; up = 1;
       npend_cur = 0;   /* every pending WRITE is now of an old epoch */
       if
       :: RESEQ -> nseq = c_base + c_cred + N
       :: else -> nseq = c_exp
       fi;
       c_base = nseq; c_exp = nseq;
       c_head = 0; c_del = 0; c_rel = 0; c_cred = 0; c_mark = 0; c_asked = 0; c_seen = 0;
       p_base = nseq;
       p_rel = 0; p_pub = 0; p_com = 0; p_want = 0; p_asked = 0; p_dead = 0; p_creq = 0;
       /* the producer's credit MR is zeroed, or the old connection's last credit record is
        * still in it (a replayed control message of the old epoch) */
       if
       :: cm_valid = 0; cm_ep = 0; cm_rel = 0
       :: cm_valid -> skip
       fi;
#if MODE == TAIL
       /* the tail MR is zeroed, or an old-epoch tail record turns up in it */
       if
       :: tm_valid = 0; tm_ep = 0; tm_tail = 0; tm_creq = 0
       :: tm_valid -> skip
       fi;
#else
       /* the new connection's CQ starts empty, or an old completion is polled on it */
       if
       :: do
          :: cq?e, t, r
          :: empty(cq) -> break
          od
       :: nempty(cq) -> skip
       fi;
#endif
       nseq = 0; e = 0; t = 0; r = 0 }
  :: drops == MAXDROP && up -> break
  od;
done:
  skip
}

/* When nothing can move any more: unless a side failed, every record was committed and
 * delivered (no credit deadlock, publish-modes.md §6.2). */
active proctype watchdog() {
  timeout ->
    assert(c_viol != 0 || p_dead || (written == MAXREC && p_pub == p_com && c_head == p_com))
}
