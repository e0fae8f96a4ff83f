/**
 * The guest CPU model (`-cpu`). Under KVM the guest sees the host CPU ("host"): every instruction runs natively,
 * so wider vectors only help. Under TCG every guest instruction is translated, and what the guest's libraries
 * choose at run time from CPUID (glibc's string functions, numpy's SIMD dispatch, the kernel's FPU state size)
 * decides how much there is to translate: a model without AVX costs less host CPU per child than "max" for the
 * same answers (bench/cpu-models measures the models side by side; `DEFAULT_TCG_CPU_MODEL` is its winner).
 *
 * A model string comes from a snapshot's manifest, which packs and registry pulls bring from elsewhere, so it is
 * checked before it reaches QEMU: a model name, then features to remove (`-avx`) or to add from ISA extensions
 * only (`+sse4.2`): virtualisation and other machine features (`+vmx`, `+svm`) are refused.
 */
import { invalidArgument } from "../common/errors.js";

/** What KVM guests run on: the host's own CPU. */
export const KVM_CPU_MODEL = "host";

/** TCG's default (bench/results/cpu-models.md). */
export const DEFAULT_TCG_CPU_MODEL = "max";

/** Features a model string may add: instruction-set extensions a guest's user space picks at run time. */
const ADDABLE_FEATURES = new Set([
  "sse3",
  "pni",
  "ssse3",
  "sse4.1",
  "sse4.2",
  "sse4a",
  "popcnt",
  "cx16",
  "lahf-lm",
  "abm",
  "bmi1",
  "bmi2",
  "movbe",
  "fma",
  "f16c",
  "avx",
  "avx2",
  "xsave",
  "xsaveopt",
  "aes",
  "pclmulqdq",
  "sha-ni",
  "rdrand",
  "rdseed",
  "adx",
  "erms",
  "fsgsbase",
]);

const MODEL_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const FEATURE = /^([+-])([a-z0-9][a-z0-9_.-]*)$/;
const MAX_MODEL_CHARS = 256;

/** Throws invalid_argument unless `model` is a model name plus optional `-feature`/`+isa-extension` items. */
export function assertCpuModel(model: unknown, what = "cpuModel"): asserts model is string {
  const refuse = (why: string) =>
    invalidArgument(
      `machine spec: ${what} ${JSON.stringify(model)} ${why} (e.g. "max", "host", "Nehalem", "max,-avx,-avx2")`,
    );
  if (typeof model !== "string" || model.length === 0 || model.length > MAX_MODEL_CHARS) {
    throw refuse("is not a CPU model");
  }
  const [name, ...features] = model.split(",");
  if (!MODEL_NAME.test(name ?? "")) throw refuse("is not a plain CPU model name");
  for (const feature of features) {
    const match = FEATURE.exec(feature);
    if (!match) throw refuse(`has a feature item ${JSON.stringify(feature)} that is not +name or -name`);
    if (match[1] === "+" && !ADDABLE_FEATURES.has(match[2] as string)) {
      throw refuse(`adds ${JSON.stringify(match[2])}, which is not an instruction-set extension`);
    }
  }
}

/**
 * The model a new snapshot's parent boots with (children take theirs from the manifest). `FORKD_TCG_CPU`
 * overrides the TCG default (e.g. to compare models: bench/cpu-models); KVM always uses the host's CPU.
 */
export function cpuModelFor(accel: "kvm" | "tcg", env: NodeJS.ProcessEnv = process.env): string {
  if (accel === "kvm") return KVM_CPU_MODEL;
  const forced = env.FORKD_TCG_CPU;
  if (forced === undefined || forced === "") return DEFAULT_TCG_CPU_MODEL;
  assertCpuModel(forced, "FORKD_TCG_CPU");
  return forced;
}
