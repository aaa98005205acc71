// ThreadSanitizer suppressions for every test and tool executable of a RDMARING_TSAN build
// (linked in by rdmaring_tsan_suppressions() in tests/CMakeLists.txt), each with its reason.
// Nothing of rdmaring's own is suppressed: a race whose frames are all ours is still reported.
extern "C" const char* __tsan_default_suppressions() {
  return
      // Boost.Lockfree's fixed-size freelist and stack read a node's `next` index non-atomically
      // before the tagged CAS that discards a stale read (boostorg/lockfree#22, #78): benign by
      // design. Only races whose innermost frame is Boost.Lockfree's.
      "race_top:boost::lockfree::\n"
      // KJ hands a cross-thread call (kj::Executor::executeSync) and its result over with futexes
      // in libkj-async, which is not built with TSan, so the hand-off's happens-before is
      // invisible to it: every value passed through the control thread would be reported.
      "race:kj::_::XThreadEvent\n"
      "race:libkj-async\n"
      // The same hand-off for a call that fails: the kj::Exception, its description allocated by
      // KJ on the control thread, is rethrown by executeSync on the caller's, which reads it
      // (control_error) with no happens-before that TSan can see.
      "race:kj::_::HeapArrayDisposer::allocateImpl\n"
      // rdma-core resolves addresses over netlink (libnl, not built with TSan) from librdmacm's
      // and libibverbs' own threads.
      "race:libnl-3.so\n";
}
