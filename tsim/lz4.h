/* Declarations of the two LZ4 functions Verilator's FST writer (fstcpp_writer.cpp) calls, for machines that have the
 * LZ4 runtime library (liblz4.so.1) but not its development headers (Debian's liblz4-dev). vta.tsim.build puts this
 * folder on the include path only in that case, and links liblz4.so.1 by name. Both functions have had this exact
 * signature and ABI since LZ4 1.7 (2015). */
#ifndef VTA_TSIM_LZ4_SHIM_H
#define VTA_TSIM_LZ4_SHIM_H
#ifdef __cplusplus
extern "C" {
#endif
int LZ4_compressBound(int inputSize);
int LZ4_compress_default(const char* src, char* dst, int srcSize, int dstCapacity);
#ifdef __cplusplus
}
#endif
#endif
